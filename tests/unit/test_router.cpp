#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "clock.h"
#include "driver_double.h"
#include "records.h"
#include "router.h"

using namespace poolshim;
using poolshim::testing::async_alloc;
using poolshim::testing::drain;
using poolshim::testing::MiB;
using poolshim::testing::ordered_config;
using poolshim::testing::RealStub;
using poolshim::testing::Rig;
using poolshim::testing::sync_alloc;
using poolshim::testing::without_cache;

TEST_CASE("router: cudaMalloc is served from the device's pool, counted once") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* p = nullptr;
  p = sync_alloc(router, 0, 1000, real);
  REQUIRE(p != nullptr);
  CHECK(real.calls == 0);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.allocs == 1);
  CHECK(s.stats.async_allocs == 0);
  CHECK(s.stats.requested_bytes.current == 1000);
  CHECK(s.stats.live_allocs.current == 1);
  CHECK(s.stats.histogram[9] == 1);  // 512 <= 1000 < 1024
  CHECK(s.pool.used == 2 * MiB);     // the heap's segment, to the driver
  CHECK(s.pool.reserved == 2 * MiB);
  CHECK(s.cached_bytes == 2 * MiB - 1024);  // the segment's free rest
  CHECK(d.calls("cuMemAllocFromPoolAsync") == 1);
  CHECK(d.calls("cuMemAlloc_v2") == 0);
  CHECK(d.calls("cuStreamSynchronize") == 1);  // usable from every stream on return
}

TEST_CASE(
    "router: cudaFree synchronizes the device, the block goes back to the heap, and with "
    "cache=0 its whole free segment then goes back to the pool") {
  Rig rig(1, 64 * MiB, without_cache());
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* p = nullptr;
  p = sync_alloc(router, 0, 1000, real);
  router.free_sync(p, 0, real);
  CHECK(real.calls == 0);
  CHECK(d.calls("cuCtxSynchronize") == 1);
  DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.frees == 1);
  CHECK(s.stats.requested_bytes.current == 0);
  CHECK(s.stats.requested_bytes.peak == 1000);
  CHECK(s.stats.live_allocs.current == 0);
  CHECK(s.stats.histogram[9] == 0);
  CHECK(s.pool.used == 2 * MiB);
  CHECK(s.cached_bytes == 2 * MiB);  // merged back into one free segment
  CHECK(router.unused_bytes(0) == 2 * MiB);

  void* q = nullptr;
  q = sync_alloc(router, 0, 1000, real);
  CHECK(q == p);  // the heap's block, no new reservation
  CHECK(d.calls("cuMemAllocFromPoolAsync") == 1);
  router.free_sync(q, 0, real);
  CHECK(router.tend_heap(0, now_ns()) == 2 * MiB);  // keeps nothing beyond what is in use
  s = router.snapshot(0);
  CHECK(s.pool.used == 0);
  CHECK(s.pool.reserved == 2 * MiB);  // the pool keeps it until a trim
  CHECK(s.stats.cache_returns == 1);
  CHECK(d.device(0).consumption == 2 * MiB);
}

TEST_CASE("router: a pointer the pool did not hand out goes to the real cudaFree unchanged") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* p = nullptr;
  p = sync_alloc(router, 0, 512, real);  // makes device 0's context current
  int host_object = 0;
  router.free_sync(&host_object, 0, real);
  CHECK(real.calls == 1);
  CHECK(router.snapshot(0).stats.passthrough_frees == 1);
  CHECK(router.snapshot(0).stats.frees == 0);
  CHECK(d.calls("cuCtxSynchronize") == 0);  // the real function does what it does natively
  router.free_sync(static_cast<char*>(p) + 16, 0, real);  // interior pointer: not ours either
  CHECK(real.calls == 2);
  CHECK(router.snapshot(0).stats.live_allocs.current == 1);
}

TEST_CASE("router: out of memory with enough unused pool memory is trimmed and retried") {
  Rig rig(1, 16 * MiB, testing::with_segments());
  auto& [d, config, events, router] = rig;
  RealStub real;
  std::vector<void*> blocks(8);
  for (auto& b : blocks) b = sync_alloc(router, 0, 3 * MiB / 2, real);
  CHECK(router.snapshot(0).pool.reserved == 16 * MiB);  // eight 2 MiB chunks: the device is full
  for (auto* b : blocks) router.free_sync(b, 0, real);
  void* big = nullptr;
  big = sync_alloc(router, 0, 6 * MiB, real);  // no chunk holds 6 MiB: a new one must be made
  CHECK(big != nullptr);
  CHECK(real.calls == 0);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.oom_retries == 1);
  CHECK(s.stats.oom_retry_successes == 1);
  CHECK(s.stats.ooms == 0);
  CHECK(s.pool.reserved == 6 * MiB);
  CHECK(d.device(0).consumption == 6 * MiB);
  CHECK(drain(events).empty());
}

TEST_CASE("router: with oom_retry off the real function's OOM stands, counted as fragmentation") {
  Config c = testing::with_segments();
  c.oom_retry = false;
  Rig rig(1, 16 * MiB, c);
  auto& [d, config, events, router] = rig;
  RealStub ok;
  std::vector<void*> blocks(8);
  for (auto& b : blocks) b = sync_alloc(router, 0, 3 * MiB / 2, ok);
  for (auto* b : blocks) router.free_sync(b, 0, ok);
  RealStub oom{RealResult::out_of_memory};
  void* big = nullptr;
  big = sync_alloc(router, 0, 6 * MiB, oom);
  CHECK(oom.calls == 1);
  CHECK(big == nullptr);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.oom_retries == 0);
  CHECK(s.stats.failed_allocs == 1);
  CHECK(s.stats.ooms == 1);
  CHECK(s.stats.oom_with_slack == 1);
  const auto e = drain(events);
  REQUIRE(e.size() == 1);
  REQUIRE(e[0].kind == Event::Kind::oom);
  CHECK(e[0].oom.request == 6 * MiB);
  CHECK(e[0].oom.reserved == 16 * MiB);  // the state at the failure
  CHECK(e[0].oom.used == 0);
  CHECK(e[0].oom.device_total == 16 * MiB);
  CHECK(e[0].oom.device_free == 0);
  CHECK(e[0].oom.released_after == 16 * MiB);  // given back before the real call
  CHECK_FALSE(e[0].oom.retried);
  CHECK(router.snapshot(0).pool.reserved == 0);
}

TEST_CASE(
    "router: a request no trim could satisfy fails natively, without a retry, and the pool gives "
    "its unused memory back") {
  Rig rig(1, 16 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub ok;
  void* p = nullptr;
  p = sync_alloc(router, 0, MiB, ok);
  router.free_sync(p, 0, ok);
  RealStub oom{RealResult::out_of_memory};
  CHECK(sync_alloc(router, 0, 1ULL << 40, oom) == nullptr);
  CHECK(oom.calls == 1);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.oom_retries == 0);
  CHECK(d.calls("cuCtxSynchronize") == 1);  // the free's; no synchronize-and-retry
  CHECK(s.pool.reserved == 0);              // the real cudaMalloc gets the cached memory
  CHECK(s.stats.ooms == 1);
  CHECK(s.stats.oom_with_slack == 0);
  const auto e = drain(events);
  REQUIRE(e.size() == 1);
  CHECK(e[0].oom.request == 1ULL << 40);
  CHECK(e[0].oom.live_count == 0);
  CHECK(e[0].oom.reserved == 2 * MiB);
  CHECK(e[0].oom.device_free == 14 * MiB);
  CHECK(e[0].oom.released_after == 2 * MiB);
}

TEST_CASE("router: an allocation the pool cannot serve but the real function can is a fallback") {
  Config c = testing::with_segments();
  c.oom_retry = false;
  Rig rig(1, 16 * MiB, c);
  auto& [d, config, events, router] = rig;
  RealStub ok;
  std::vector<void*> blocks(8);
  for (auto& b : blocks) b = sync_alloc(router, 0, 3 * MiB / 2, ok);
  for (auto* b : blocks) router.free_sync(b, 0, ok);
  CHECK(sync_alloc(router, 0, 6 * MiB, ok) == nullptr);  // the real function served it
  CHECK(ok.calls == 1);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.fallback_allocs == 1);
  CHECK(s.stats.failed_allocs == 0);
  CHECK(s.stats.allocs == 8);
  const auto e = drain(events);
  REQUIRE(e.size() == 1);
  CHECK(e[0].kind == Event::Kind::warning);
}

TEST_CASE(
    "router: cudaMallocAsync is served from a segment of the heap, which a free on the same "
    "stream serves again at once") {
  Rig rig(1, 64 * MiB, without_cache());
  auto& [d, config, events, router] = rig;
  d.make_current(0);
  CUstream stream = nullptr;
  REQUIRE(d.api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHECK(router.stream_device(stream) == 0);
  RealStub real;
  void* p = nullptr;
  p = async_alloc(router, 0, 4096, stream, real);
  REQUIRE(p != nullptr);
  StreamRegistry streams;  // stream creation seen: the stream's handle is a safe token
  streams.mark_observed();
  router.set_stream_registry(&streams);
  router.free_async(p, stream, real);
  CHECK(d.device(0).pending_free_count == 0);  // kept by the heap: no driver call
  void* q = nullptr;
  q = async_alloc(router, 0, 4096, stream, real);
  CHECK(q == p);  // the same stream may reuse its free at once
  CHECK(real.calls == 0);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.async_allocs == 2);
  CHECK(s.stats.async_frees == 1);
  CHECK(s.stats.allocs == 2);
  CHECK(s.stats.live_allocs.current == 1);
  CHECK(s.stats.cache_hits == 1);
  CHECK(d.calls("cuCtxSynchronize") == 0);
  CHECK(d.calls("cuStreamSynchronize") == 1);  // the segment's, on the pool's own stream
  CHECK(d.calls("cuMemAllocFromPoolAsync") == 1);
}

TEST_CASE("router: cudaMallocAsync with an application-owned current pool passes through") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  router.set_app_pool(0, true);
  RealStub real;
  CHECK(async_alloc(router, 0, 4096, nullptr, real) == nullptr);
  CHECK(real.calls == 1);
  CHECK(router.snapshot(0).stats.passthrough_allocs == 1);
  router.set_app_pool(0, false);
  CHECK(async_alloc(router, 0, 4096, nullptr, real) != nullptr);
  CHECK(real.calls == 1);
  CHECK(router.snapshot(0).stats.async_allocs == 1);
}

TEST_CASE("router: cudaDeviceReset drops the pool and the device's live allocations") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* a = sync_alloc(router, 0, 1000, real);
  CHECK(sync_alloc(router, 0, 5000, real) != nullptr);
  CHECK(d.device(0).pool_count == 1);
  router.before_device_reset(0);
  CHECK(d.device(0).pool_count == 0);
  DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.reset_dropped == 2);
  CHECK(s.stats.live_allocs.current == 0);
  CHECK(s.stats.requested_bytes.current == 0);
  CHECK(router.live_allocations().empty());
  // The application's cudaDeviceReset follows; afterwards a fresh pool is made on demand.
  auto reset = d.symbol<CUresult (*)(CUdevice)>("cuDevicePrimaryCtxReset_v2");
  REQUIRE(reset(0) == CUDA_SUCCESS);
  RealStub foreign;
  router.free_sync(a, 0, foreign);  // dropped by the reset: no longer the pool's
  CHECK(foreign.calls == 1);
  void* c = nullptr;
  c = sync_alloc(router, 0, 1000, real);
  CHECK(c != nullptr);
  CHECK(real.calls == 0);
  CHECK(d.device(0).pool_count == 1);
  CHECK(router.snapshot(0).stats.allocs == 3);
}

TEST_CASE("router: a thread with no current context gets the device's primary context") {
  Rig rig(1, 64 * MiB);
  Router& router = rig.router;  // lambdas capture it (C++17 cannot capture bindings)
  void* p = nullptr;
  int real_calls = 0;
  std::thread t([&] {
    p = sync_alloc(router, 0, 1000, [&] {
      ++real_calls;
      return RealResult::success;
    });
  });
  t.join();
  CHECK(p != nullptr);
  CHECK(real_calls == 0);
}

TEST_CASE("router: another device's context being current makes cudaMalloc pass through") {
  Rig rig(2, 64 * MiB);
  auto& [d, config, events, router] = rig;
  d.make_current(1);
  RealStub real;
  CHECK(sync_alloc(router, 0, 1000, real) == nullptr);
  CHECK(real.calls == 1);
  CHECK(router.snapshot(0).stats.passthrough_allocs == 1);
  CHECK(sync_alloc(router, 1, 1000, real) != nullptr);
  CHECK(real.calls == 1);
  CHECK(router.snapshot(1).stats.allocs == 1);
}

TEST_CASE("router: each device has its own pool and counters") {
  Rig rig(2, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  d.make_current(0);
  void* p0 = sync_alloc(router, 0, 3 * MiB, real);
  d.make_current(1);
  CHECK(sync_alloc(router, 1, 1000, real) != nullptr);
  CHECK(router.active_devices() == std::vector<int>{0, 1});
  CHECK(router.snapshot(0).pool.reserved == 20 * MiB);  // a large segment
  CHECK(router.snapshot(1).pool.reserved == 2 * MiB);   // a small one
  // Freeing device 0's block while device 1 is current synchronizes both, then frees.
  router.free_sync(p0, 1, real);
  CHECK(real.calls == 0);
  CHECK(router.snapshot(0).stats.frees == 1);
  CHECK(router.snapshot(1).stats.frees == 0);
  CHECK(d.calls("cuCtxSynchronize") == 2);
}

TEST_CASE(
    "router: a free while routing is suspended is answered by the real function on the proxy, "
    "the block goes back to the heap behind a fence") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* p = nullptr;
  p = sync_alloc(router, 0, 1000, real);
  router.before_capture();  // the proxy is made before a capture begins
  REQUIRE(d.calls("cuMemAlloc_v2") == 1);
  router.free_unrouted(p, 0, real);
  CHECK(real.calls == 1);
  CHECK(real.last_pointer != p);         // the proxy, a real allocation of the shim's own
  CHECK(d.calls("cuMemAlloc_v2") == 2);  // freed by the real function: made anew
  DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.passthrough_frees == 1);
  CHECK(s.stats.live_allocs.current == 0);
  CHECK(router.live_allocations().empty());
  CHECK(s.cached_bytes == 2 * MiB);
  // Not reusable before a fence (a free during a capture does not synchronize), and no event
  // fence can be made without a stream registry: a new segment, no host stall.
  CHECK(sync_alloc(router, 0, 1000, real) != p);
  CHECK(d.calls("cuCtxSynchronize") == 0);
  CHECK(router.snapshot(0).pool.reserved == 4 * MiB);
}

TEST_CASE(
    "router: without a proxy, a suspended free of a segment's first block asks the real "
    "function for an address inside it, and the block stays live") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub ok;
  void* p = sync_alloc(router, 0, 1000, ok);
  RealStub refused{RealResult::error};  // what the driver answers for such an address
  router.free_unrouted(p, 0, refused);
  CHECK(refused.calls == 1);
  CHECK(refused.last_pointer == static_cast<char*>(p) + 256);  // never the segment's base
  CHECK(router.live_allocations().size() == 1);
}

TEST_CASE("router: a failed real free of a pooled pointer keeps it live") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub ok;
  void* p = nullptr;
  p = sync_alloc(router, 0, 1000, ok);
  RealStub failing{RealResult::error};
  router.free_unrouted(p, 0, failing);
  CHECK(router.live_allocations().size() == 1);
  CHECK(router.snapshot(0).stats.live_allocs.current == 1);
}

TEST_CASE(
    "router: cache off: zero live allocations after many threads allocate and free concurrently") {
  Rig rig(1, 256 * MiB, without_cache());
  Router& router = rig.router;  // lambdas capture it (C++17 cannot capture bindings)
  std::vector<std::thread> threads;
  std::atomic<int> real_calls{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        void* p = nullptr;
        auto real = [&](auto&&...) {
          real_calls.fetch_add(1);
          return RealResult::success;
        };
        p = sync_alloc(router, 0, 256 + 4096 * ((i * 7 + t) % 16), real);
        router.free_sync(p, 0, real);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(real_calls.load() == 0);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.allocs == 1600);
  CHECK(s.stats.frees == 1600);
  CHECK(s.stats.live_allocs.current == 0);
  CHECK(s.stats.requested_bytes.current == 0);
  router.tend_heap(0, now_ns());  // cache=0: every whole free segment goes back
  CHECK(router.snapshot(0).pool.used == 0);
}

TEST_CASE("router: an ordered free makes no driver call and no host stall") {
  Rig rig(1, 64 * MiB, without_cache(ordered_config()));
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  router.set_stream_registry(&streams);
  d.make_current(0);
  CUstream app_stream = nullptr;
  REQUIRE(d.api.cuStreamCreate(&app_stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUevent app_event = nullptr;
  REQUIRE(d.api.cuEventCreate(&app_event, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  streams.add({app_stream, 0, app_event});
  streams.mark_observed();
  RealStub real;
  void* p = sync_alloc(router, 0, 1000, real);
  router.free_sync(p, 0, real);
  CHECK(real.calls == 0);
  CHECK(d.calls("cuCtxSynchronize") == 0);  // no host stall
  CHECK(d.calls("cuEventRecord") == 0);     // ordering waits for the next fence
  CHECK(d.calls("cuStreamWaitEvent") == 0);
  CHECK(d.calls("cuMemFreeAsync") == 0);
  CHECK(router.snapshot(0).cached_bytes == 2 * MiB);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.frees == 1);
  CHECK(s.stats.ordered_frees == 1);
  CHECK(s.stats.live_allocs.current == 0);
  CHECK(drain(events).empty());
}

TEST_CASE("router: an ordered free falls back to sync when stream creation was not seen") {
  Rig rig(1, 64 * MiB, ordered_config());
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;  // never marked observed
  router.set_stream_registry(&streams);
  RealStub real;
  void* p = sync_alloc(router, 0, 1000, real);
  router.free_sync(p, 0, real);
  CHECK(d.calls("cuCtxSynchronize") == 1);
  CHECK(router.snapshot(0).stats.ordered_frees == 0);
  const auto e = drain(events);
  REQUIRE(e.size() == 1);
  CHECK(e[0].text ==
        "free mode ordered: the application's stream creation was not seen by the shim; such "
        "frees synchronize the device as in mode sync");
}

TEST_CASE("router: an ordered free falls back to sync while another device is active") {
  Rig rig(2, 64 * MiB, ordered_config());
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  streams.mark_observed();
  router.set_stream_registry(&streams);
  d.make_current(1);  // device 1's primary context becomes active
  d.make_current(0);
  RealStub real;
  void* p = sync_alloc(router, 0, 1000, real);
  router.free_sync(p, 0, real);
  CHECK(d.calls("cuCtxSynchronize") == 1);
  CHECK(router.snapshot(0).stats.ordered_frees == 0);
  REQUIRE(drain(events).size() == 1);
}

TEST_CASE("router: an ordered free falls back to sync once the application made a context") {
  Rig rig(1, 64 * MiB, ordered_config());
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  streams.mark_observed();
  streams.mark_foreign_context();
  router.set_stream_registry(&streams);
  RealStub real;
  void* p = sync_alloc(router, 0, 1000, real);
  router.free_sync(p, 0, real);
  CHECK(d.calls("cuCtxSynchronize") == 1);
  CHECK(router.snapshot(0).stats.ordered_frees == 0);
}

TEST_CASE("router: a destroyed stream's queued work still orders later ordered frees") {
  Rig rig(1, 64 * MiB, ordered_config());
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  streams.mark_observed();
  router.set_stream_registry(&streams);
  d.make_current(0);
  RealStub real;
  void* p = sync_alloc(router, 0, 1000, real);  // the pool must exist for the wait to be made
  CUstream app_stream = nullptr;
  REQUIRE(d.api.cuStreamCreate(&app_stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUevent app_event = nullptr;
  REQUIRE(d.api.cuEventCreate(&app_event, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  streams.add({app_stream, 0, app_event});
  StreamRegistry::Entry entry;
  std::size_t listed_during_last_use = 0;
  REQUIRE(streams.remove(app_stream, &entry, [&](const StreamRegistry::Entry& e) {
    listed_during_last_use = streams.size_unlocked_for_tests();
    router.wait_for_stream_at_destroy(e);
  }));
  router.release_stream_event(entry);
  CHECK(listed_during_last_use == 1);  // no fence could run in between and miss the stream
  CHECK(d.calls("cuEventRecord") == 1);
  CHECK(d.calls("cuStreamWaitEvent") == 1);
  CHECK(d.calls("cuEventDestroy_v2") == 1);
  CHECK(streams.size() == 0);
  router.free_sync(p, 0, real);
  CHECK(router.snapshot(0).stats.ordered_frees == 1);
}

TEST_CASE("router: a stream without an event makes an ordered free synchronize instead") {
  Rig rig(1, 64 * MiB, ordered_config());
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  streams.mark_observed();
  router.set_stream_registry(&streams);
  d.make_current(0);
  CUstream app_stream = nullptr;
  REQUIRE(d.api.cuStreamCreate(&app_stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  streams.add({app_stream, 0, nullptr});
  RealStub real;
  void* p = sync_alloc(router, 0, 1000, real);
  router.free_sync(p, 0, real);
  CHECK(router.snapshot(0).stats.ordered_frees == 0);
  CHECK(router.snapshot(0).stats.frees == 1);
  CHECK(d.calls("cuCtxSynchronize") == 1);
}

TEST_CASE("router: cudaDeviceReset forgets the device's registered streams") {
  Rig rig(2, 64 * MiB, ordered_config());
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  router.set_stream_registry(&streams);
  streams.add({reinterpret_cast<CUstream>(0x10), 0, nullptr});
  streams.add({reinterpret_cast<CUstream>(0x20), 1, nullptr});
  router.before_device_reset(0);
  CHECK(streams.size() == 1);
  StreamRegistry::Entry e;
  CHECK(streams.remove(reinterpret_cast<CUstream>(0x20), &e));
  CHECK_FALSE(streams.remove(reinterpret_cast<CUstream>(0x10), &e));
}

TEST_CASE("router: peer access opens the peer's pool, also one made afterwards") {
  Rig rig(2, 64 * MiB);
  auto& [d, config, events, router] = rig;
  PeerAccess peers;
  router.set_peer_access(&peers);
  peers.enable(1, 0);  // device 1 reaches device 0's memory, before device 0's pool exists
  RealStub real;
  d.make_current(0);
  CHECK(sync_alloc(router, 0, 1000, real) != nullptr);
  CHECK(d.calls("cuMemPoolSetAccess") == 1);  // opened when it was made
  d.make_current(1);
  CHECK(sync_alloc(router, 1, 1000, real) != nullptr);
  CHECK(d.calls("cuMemPoolSetAccess") == 1);  // nobody reaches device 1
  peers.enable(0, 1);
  router.open_pool_to(1, 0);  // enabled later: the existing pool opens now
  CHECK(d.calls("cuMemPoolSetAccess") == 2);
  CHECK(peers.accessors(0) == std::vector<int>{1});
  CHECK(drain(events).empty());
}

TEST_CASE("router: a capped pool refuses growth past the cap with the native error") {
  Config c = testing::with_segments();
  c.limit = *parse_size("16M", true);
  Rig rig(1, 64 * MiB, c);
  auto& [d, config, events, router] = rig;
  RealStub ok;
  for (int i = 0; i < 3; ++i) CHECK(sync_alloc(router, 0, 4 * MiB, ok) != nullptr);  // 12 MiB
  std::size_t free = 60 * MiB;
  std::size_t total = 64 * MiB;
  router.adjust_memory_info(0, &free, &total);
  CHECK(total == 16 * MiB);  // the application sees a device of the cap's size
  CHECK(free == 4 * MiB);    // and the cap's headroom as free
  RealStub refused{RealResult::out_of_memory};
  CHECK(sync_alloc(router, 0, 6 * MiB, refused) == nullptr);
  CHECK(refused.calls == 1);
  CHECK(refused.last_request == kRefusedRequest);  // the real function must not allocate it
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.ooms == 1);
  CHECK(s.pool.reserved == 12 * MiB);
  CHECK(d.device(0).consumption == 12 * MiB);
  const auto e = drain(events);
  REQUIRE(e.size() == 1);
  CHECK(e[0].oom.cap == 16 * MiB);
  CHECK(e[0].oom.request == 6 * MiB);
  CHECK(e[0].oom.used == 12 * MiB);
  CHECK(std::string(oom_verdict(e[0].oom)) == "cap");
}

TEST_CASE("router: POOLSHIM_LIMIT_<device> caps that device only") {
  const ParsedConfig parsed = parse_config({"POOLSHIM_LIMIT_1=8M"});
  REQUIRE(parsed.warnings.empty());
  Rig rig(2, 64 * MiB, parsed.config);
  auto& [d, config, events, router] = rig;
  RealStub ok;
  d.make_current(0);
  CHECK(sync_alloc(router, 0, 10 * MiB, ok) != nullptr);
  d.make_current(1);
  RealStub refused{RealResult::out_of_memory};
  CHECK(sync_alloc(router, 1, 10 * MiB, refused) == nullptr);
  CHECK(refused.last_request == kRefusedRequest);
}

TEST_CASE("router: in observe mode cudaMalloc and cudaFree go to the real functions, tracked") {
  Config c = Config::defaults();
  c.mode = "observe";
  Rig rig(1, 64 * MiB, c);
  auto& [d, config, events, router] = rig;
  RealStub real;
  CUdeviceptr p = 0;
  CHECK_FALSE(router.allocate_sync(0, 1000, &p, real));
  CHECK(p == 0);  // the application's pointer is the real function's
  CHECK(real.calls == 1);
  CHECK(real.last_request == 1000);
  CHECK(router.allocate_async(0, 3000, nullptr, &p, real) == false);
  CHECK(d.calls("cuMemAllocFromPoolAsync") == 0);
  CHECK(d.calls("cuMemPoolCreate") == 0);  // observe mode makes no pool
  DeviceSnapshot s = router.snapshot(0);
  CHECK(s.observe);
  CHECK(s.native_bytes == 4000);
  CHECK(s.native_allocs == 2);
  CHECK(s.stats.allocs == 2);
  CHECK(s.stats.async_allocs == 1);
  CHECK(s.stats.requested_bytes.current == 4000);
  CHECK(s.pool.reserved == 0);
  CHECK(router.live_allocations().size() == 2);
  CHECK(router.pooled_allocations() == 0);
  const auto first = reinterpret_cast<void*>(real.native_next - MiB);  // the first address
  router.free_sync(first, 0, real);
  CHECK(real.last_pointer == first);
  CHECK(real.calls == 3);
  s = router.snapshot(0);
  CHECK(s.native_bytes == 3000);
  CHECK(s.native_bytes_peak == 4000);
  CHECK(s.stats.frees == 1);
  CHECK(s.stats.requested_bytes.current == 3000);
}

TEST_CASE("router: in observe mode the cap refuses natively and reports an out-of-memory") {
  Config c = Config::defaults();
  c.mode = "observe";
  c.limit = SizeValue{16 * MiB};
  Rig rig(1, 64 * MiB, c);
  auto& [d, config, events, router] = rig;
  RealStub real;
  CUdeviceptr p = 0;
  router.allocate_sync(0, 12 * MiB, &p, real);
  CHECK(real.last_request == 12 * MiB);
  real.result = RealResult::out_of_memory;  // what the real function says to kRefusedRequest
  router.allocate_sync(0, 6 * MiB, &p, real);
  CHECK(real.last_request == kRefusedRequest);
  CHECK(router.cap(0) == 16 * MiB);
  std::size_t free = 60 * MiB;
  std::size_t total = 64 * MiB;
  router.adjust_memory_info(0, &free, &total);
  CHECK(free == 4 * MiB);
  CHECK(total == 16 * MiB);
  const auto ev = drain(events);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].oom.observe);
  CHECK(ev[0].oom.request == 6 * MiB);
  CHECK(ev[0].oom.used == 12 * MiB);
  CHECK(ev[0].oom.cap == 16 * MiB);
  CHECK(std::string(oom_verdict(ev[0].oom)) == "cap");
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.ooms == 1);
  CHECK(s.native_bytes == 12 * MiB);
}

TEST_CASE("router: a pass-through allocation in pool mode is tracked in bytes, not pooled") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  router.set_app_pool(0, true);  // its cudaMallocAsync calls pass through
  RealStub real;
  CUdeviceptr p = 0;
  CHECK_FALSE(router.allocate_async(0, 5000, nullptr, &p, real));
  DeviceSnapshot s = router.snapshot(0);
  CHECK(s.native_bytes == 5000);
  CHECK(s.native_allocs == 1);
  CHECK(s.stats.requested_bytes.current == 0);
  CHECK(s.stats.passthrough_allocs == 1);
  router.free_async(reinterpret_cast<void*>(real.native_next), nullptr, real);
  CHECK(real.last_pointer == reinterpret_cast<void*>(real.native_next));
  s = router.snapshot(0);
  CHECK(s.native_bytes == 0);
  CHECK(s.native_bytes_peak == 5000);
  CHECK(s.stats.frees == 0);
}
