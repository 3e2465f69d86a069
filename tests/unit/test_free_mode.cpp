// free=auto (issue 13): ordered in a PyTorch process, sync otherwise; sync and ordered as asked.
#include <catch2/catch.hpp>

#include "free_mode.h"

using namespace poolshim;

TEST_CASE("free mode: auto is ordered where PyTorch's CUDA library is loaded") {
  const FreeMode m = resolve_free_mode(
      "auto",
      {"/usr/lib/libc.so.6", "/opt/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so"});
  CHECK(m.ordered);
  CHECK(m.why == "free=auto: ordered, PyTorch's libc10_cuda.so is loaded");
}

TEST_CASE("free mode: auto is sync in any other process") {
  const FreeMode m =
      resolve_free_mode("auto", {"/usr/lib/libc.so.6", "/usr/lib/libc10.so",
                                 "/usr/lib/libcudart.so.13", "/tmp/my_libc10_cuda.so"});
  CHECK_FALSE(m.ordered);
  CHECK(m.why == "free=auto: sync, no library known to order its frees by streams is loaded");
}

TEST_CASE("free mode: sync and ordered are taken as asked, whatever is loaded") {
  CHECK_FALSE(resolve_free_mode("sync", {"/x/libc10_cuda.so"}).ordered);
  CHECK(resolve_free_mode("ordered", {}).ordered);
  CHECK(resolve_free_mode("ordered", {}).why == "free=ordered");
}

TEST_CASE("free mode: this test process's own libraries are listed") {
  bool libc = false;
  for (const std::string& path : loaded_libraries()) {
    if (path.find("libc.so") != std::string::npos) libc = true;
  }
  CHECK(libc);
}
