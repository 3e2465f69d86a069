// Legacy IPC of pooled memory (pool/ipc_share.h, issue 14) in the exporting process, over the
// driver double: which blocks export, the bytes of their handles, and what opening answers here.
// Opening in another process is the end-to-end suite's (ipc_share, native and under the shim).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "driver_double.h"
#include "ipc_share.h"
#include "router.h"

using namespace poolshim;
using poolshim::testing::MiB;
using poolshim::testing::RealStub;
using poolshim::testing::Rig;
using poolshim::testing::sync_alloc;

namespace {

struct Handle {
  unsigned char bytes[IpcShare::kHandleBytes];
};

template <typename T>
T field(const Handle& h, std::size_t offset) {
  T v{};
  std::memcpy(&v, h.bytes + offset, sizeof v);
  return v;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE(
    "ipc: a block of a paged arena exports as poolshim's handle (magic, pid, token, id), the "
    "same block gives the same bytes and a new block at its address a new id") {
  Rig rig(1, 256 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* p = sync_alloc(router, 0, 3 * MiB, real);
  REQUIRE(p != nullptr);
  const auto ptr = reinterpret_cast<CUdeviceptr>(p);
  Handle first{}, again{};
  REQUIRE(router.ipc_export(ptr, first.bytes));
  REQUIRE(router.ipc_export(ptr, again.bytes));
  CHECK(IpcShare::ours(first.bytes));
  CHECK(std::memcmp(first.bytes, "\x7fpoolsh1", 8) == 0);
  CHECK(field<std::int32_t>(first, 8) == getpid());
  CHECK(field<std::uint32_t>(first, 12) == 0);
  CHECK(field<std::uint64_t>(first, 16) == router.ipc().broker().token());
  CHECK(field<std::uint64_t>(first, 16) != 0);
  CHECK(field<std::uint64_t>(first, 24) == 1);
  for (std::size_t i = 32; i < IpcShare::kHandleBytes; ++i) CHECK(first.bytes[i] == 0);
  CHECK(std::memcmp(first.bytes, again.bytes, sizeof first.bytes) == 0);
  CHECK(router.ipc().exports() == 1);
  // The broker listens from the first export on, on this process's socket.
  CHECK(router.ipc().broker().running());
  CHECK(exists(router.ipc().broker().socket_path(getpid())));

  // Freed, its export goes; the block the heap hands out next at the same address is another.
  router.free_sync(p, 0, real);
  CHECK(router.ipc().exports() == 0);
  void* q = sync_alloc(router, 0, 3 * MiB, real);
  REQUIRE(q == p);
  Handle next{};
  REQUIRE(router.ipc_export(ptr, next.bytes));
  CHECK(field<std::uint64_t>(next, 24) == 2);
  router.free_sync(q, 0, real);

  router.ipc_stop();
  CHECK_FALSE(exists(router.ipc().broker().socket_path(getpid())));
}

TEST_CASE(
    "ipc: a small block, an address inside a block and memory the pool did not hand out are "
    "not exported, and start no broker") {
  Rig rig(1, 256 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* small = sync_alloc(router, 0, 4096, real);
  void* large = sync_alloc(router, 0, 3 * MiB, real);
  REQUIRE(small != nullptr);
  REQUIRE(large != nullptr);
  Handle h{};
  CHECK_FALSE(router.ipc_export(reinterpret_cast<CUdeviceptr>(small), h.bytes));
  CHECK_FALSE(router.ipc_export(reinterpret_cast<CUdeviceptr>(large) + 4096, h.bytes));
  CHECK_FALSE(router.ipc_export(0x1000, h.bytes));
  CHECK(router.ipc().exports() == 0);
  CHECK_FALSE(router.ipc().broker().running());
  router.free_sync(small, 0, real);
  router.free_sync(large, 0, real);
}

TEST_CASE("ipc: with ipc=0 the arena's pages are not exportable and nothing exports") {
  Config c = Config::defaults();
  c.ipc = false;
  Rig rig(1, 256 * MiB, c);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* p = sync_alloc(router, 0, 3 * MiB, real);
  REQUIRE(p != nullptr);
  Handle h{};
  CHECK_FALSE(router.ipc_export(reinterpret_cast<CUdeviceptr>(p), h.bytes));
  CHECK(router.ipc().exports() == 0);
  router.free_sync(p, 0, real);
}

TEST_CASE(
    "ipc: opening a handle of this process answers CUDA_ERROR_INVALID_CONTEXT, one no live "
    "export answers CUDA_ERROR_INVALID_HANDLE, and closing a foreign address is not ours") {
  Rig rig(1, 256 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  d.make_current(0);
  void* p = sync_alloc(router, 0, 3 * MiB, real);
  REQUIRE(p != nullptr);
  Handle h{};
  REQUIRE(router.ipc_export(reinterpret_cast<CUdeviceptr>(p), h.bytes));
  CUdeviceptr out = 0;
  CHECK(router.ipc_open(h.bytes, &out) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(out == 0);

  // The same bytes claiming another process, one with no broker: nothing answers.
  Handle forged = h;
  const std::int32_t nobody = getpid() + 1000000;
  std::memcpy(forged.bytes + 8, &nobody, sizeof nobody);
  CHECK(router.ipc_open(forged.bytes, &out) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(router.ipc().imports() == 0);

  Handle zero{};
  CHECK_FALSE(IpcShare::ours(zero.bytes));
  CUresult result = CUDA_ERROR_UNKNOWN;
  CHECK_FALSE(router.ipc_close(reinterpret_cast<CUdeviceptr>(p), &result));
  CHECK(result == CUDA_ERROR_UNKNOWN);
  router.free_sync(p, 0, real);
}
