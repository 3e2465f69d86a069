#include <catch2/catch.hpp>

#include <cstdlib>

#include "nvtx_marks.h"

namespace marks = poolshim::nvtx_marks;

// The unit tests run without an NVTX tool (the e2e cases nvtx_* run with one): these are the
// figures of a process that nobody profiles.
TEST_CASE("nvtx: without a tool the domain stays null and trim runs the trim once") {
  if (std::getenv("NVTX_INJECTION64_PATH") != nullptr) {
    WARN("run under an NVTX tool: nothing to check");
    return;
  }
  marks::start();
  CHECK_FALSE(marks::active());
  int calls = 0;
  CHECK(marks::trim(marks::Trim::idle, 0, [&] {
          ++calls;
          return std::uint64_t{20} << 20;
        }) == std::uint64_t{20} << 20);
  CHECK(calls == 1);
  {
    const marks::WaitRange wait(marks::Wait::sync_free, 0);
    marks::mark_oom(0, 1 << 20, "exhausted");
    marks::mark_cache_return(0, 1 << 20);
  }
  CHECK_FALSE(marks::active());
}
