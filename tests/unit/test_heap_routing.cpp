// The heap in front of the pool, as the Router uses it (issue 13): reuse without a driver call,
// exactly as safe as the driver's own reuse, by the reuse rules of DESIGN §7, and bounded
// memory. Exact figures over the driver double (2 MiB small segments, 20 MiB large ones).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "clock.h"
#include "driver_double.h"
#include "router.h"

using namespace poolshim;
using poolshim::testing::async_alloc;
using poolshim::testing::MiB;
using poolshim::testing::ordered_config;
using poolshim::testing::RealStub;
using poolshim::testing::Rig;
using poolshim::testing::sync_alloc;
using poolshim::testing::without_cache;

namespace {

Config with_cache(std::uint64_t bytes, Config c = Config::defaults()) {
  c.cache = SizeValue{bytes, 0.0, false};
  return c;
}

// cudaMalloc then cudaFree of `bytes` on device 0: the block goes back to the heap.
template <typename Real>
void* freed_block(Router& router, std::size_t bytes, Real& real) {
  void* p = sync_alloc(router, 0, bytes, real);
  router.free_sync(p, 0, real);
  return p;
}

CUstream make_stream(const testing::DriverDouble& d) {
  CUstream s = nullptr;
  REQUIRE(d.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  return s;
}

// The shim has seen stream creation, and one stream is listed without an event: no event fence
// can be made (the double's events would complete at once), so only a synchronization is a
// fence. Device 0's context is made current.
void streams_without_event_fences(Rig& rig, StreamRegistry& streams) {
  streams.mark_observed();
  rig.router.set_stream_registry(&streams);
  rig.d.make_current(0);
  streams.add({make_stream(rig.d), 0, nullptr});
}

// A 4 KiB block allocated and freed on a new stream s1 (streams_without_event_fences first).
void* freed_on_new_stream(Rig& rig, StreamRegistry& streams, CUstream* s1, RealStub& real) {
  streams_without_event_fences(rig, streams);
  *s1 = make_stream(rig.d);
  void* p = async_alloc(rig.router, 0, 4096, *s1, real);
  rig.router.free_async(p, *s1, real);
  return p;
}

// `count` 12 MiB blocks freed on s1, waiting for a fence before another stream may take them;
// then one 12 MiB request on s2 (streams_without_event_fences first).
void wait_then_ask_elsewhere(Rig& rig, StreamRegistry& streams, int count) {
  streams_without_event_fences(rig, streams);
  const CUstream s1 = make_stream(rig.d);
  const CUstream s2 = make_stream(rig.d);
  RealStub real;
  std::vector<void*> blocks;
  for (int i = 0; i < count; ++i) blocks.push_back(async_alloc(rig.router, 0, 12 * MiB, s1, real));
  for (void* b : blocks) rig.router.free_async(b, s1, real);
  REQUIRE(rig.router.snapshot(0).pool.reserved == count * 12 * MiB);
  CHECK(async_alloc(rig.router, 0, 12 * MiB, s2, real) != nullptr);
}

}  // namespace

TEST_CASE("heap: a block freed by cudaFree serves the next cudaMalloc without a driver call") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* p = freed_block(router, 1000, real);
  CHECK(d.calls("cuCtxSynchronize") == 1);  // cudaFree's native synchronization, a fence
  CHECK(d.calls("cuMemFreeAsync") == 0);    // kept by the heap, not freed
  DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.frees == 1);
  CHECK(s.stats.live_allocs.current == 0);
  CHECK(s.cached_bytes == 2 * MiB);  // merged with the rest of its segment
  CHECK(s.pool.used == 2 * MiB);     // the segment, to the driver
  CHECK(router.unused_bytes(0) == 2 * MiB);

  void* q = sync_alloc(router, 0, 1000, real);
  CHECK(q == p);
  CHECK(real.calls == 0);
  CHECK(d.calls("cuMemAllocFromPoolAsync") == 1);
  CHECK(d.calls("cuStreamSynchronize") == 1);  // only the segment's
  s = router.snapshot(0);
  CHECK(s.stats.allocs == 2);
  CHECK(s.stats.cache_hits == 1);
  CHECK(s.stats.cache_misses == 1);
  CHECK(s.cached_bytes == 2 * MiB - 1024);
  CHECK(s.cached_bytes_peak == 2 * MiB);
  CHECK(s.stats.live_allocs.current == 1);
}

TEST_CASE("heap: sizes that change from call to call reuse one segment") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  for (std::size_t bytes : {1000u, 300000u, 700000u, 4096u, 1048576u, 65536u}) {
    freed_block(router, bytes, real);
  }
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(d.calls("cuMemAllocFromPoolAsync") == 1);
  CHECK(s.pool.reserved == 2 * MiB);
  CHECK(s.stats.cache_hits == 5);
}

TEST_CASE(
    "heap: a block freed on a stream serves that stream at once, another stream only after a "
    "fence") {
  Rig rig(1, 64 * MiB, testing::with_segments());
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  streams_without_event_fences(rig, streams);
  const CUstream s1 = make_stream(d);
  const CUstream s2 = make_stream(d);
  RealStub real;
  void* fence_maker = sync_alloc(router, 0, 3 * MiB / 2, real);  // a large segment of its own
  void* p = async_alloc(router, 0, 4096, s1, real);
  router.free_async(p, s1, real);
  CHECK(d.calls("cuMemFreeAsync") == 0);
  void* q = async_alloc(router, 0, 4096, s2, real);
  const auto seg1 = reinterpret_cast<std::uintptr_t>(p);
  const auto at = reinterpret_cast<std::uintptr_t>(q);
  CHECK((at < seg1 || at >= seg1 + 2 * MiB));        // s2 is not ordered behind s1's use of p
  void* r = async_alloc(router, 0, 4096, s1, real);  // s1 is: no growth
  CHECK(r != nullptr);
  CHECK(d.calls("cuMemAllocFromPoolAsync") == 3);
  router.free_async(r, s1, real);          // s1's whole segment, for s2 only after a fence
  router.free_sync(fence_maker, 0, real);  // synchronizes the device: a fence
  // Three 1 MiB blocks for s2 fit without growth only if s1's segment serves s2 now: q's
  // segment holds one beside q, s1's two.
  for (int i = 0; i < 3; ++i) CHECK(async_alloc(router, 0, MiB, s2, real) != nullptr);
  CHECK(d.calls("cuMemAllocFromPoolAsync") == 3);
  CHECK(router.snapshot(0).stats.fences == 0);
  CHECK(real.calls == 0);
}

TEST_CASE("heap: without seeing stream destruction a named stream gets no shortcut") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;  // never observed: a stream's handle could be reused unseen
  router.set_stream_registry(&streams);
  d.make_current(0);
  const CUstream s1 = make_stream(d);
  RealStub real;
  void* p = async_alloc(router, 0, 4096, s1, real);
  router.free_async(p, s1, real);
  CHECK(async_alloc(router, 0, 4096, s1, real) != p);
  CHECK(router.snapshot(0).cached_bytes == 4 * MiB - 4096);
}

TEST_CASE("heap: the legacy default stream's blocks serve it at once") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  d.make_current(0);
  RealStub real;
  void* p = async_alloc(router, 0, 4096, nullptr, real);
  router.free_async(p, nullptr, real);
  CHECK(async_alloc(router, 0, 4096, CU_STREAM_LEGACY, real) == p);
}

TEST_CASE("heap: a destroyed stream's blocks lose the shortcut") {
  Rig rig(1, 64 * MiB);
  auto& router = rig.router;
  StreamRegistry streams;
  CUstream s1 = nullptr;
  RealStub real;
  void* p = freed_on_new_stream(rig, streams, &s1, real);
  router.before_any_stream_destroy(s1);  // a new stream may get the same handle
  CHECK(async_alloc(router, 0, 4096, s1, real) != p);
  CHECK(router.snapshot(0).cached_bytes == 4 * MiB - 4096);
}

TEST_CASE(
    "heap: an ordered cudaFree makes no driver call, cudaMalloc takes the block once an event "
    "fence behind every stream has completed") {
  Rig rig(1, 64 * MiB, ordered_config());
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  router.set_stream_registry(&streams);
  d.make_current(0);
  const CUstream app_stream = make_stream(d);
  CUevent app_event = nullptr;
  REQUIRE(d.api.cuEventCreate(&app_event, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  streams.add({app_stream, 0, app_event});
  streams.mark_observed();
  RealStub real;
  void* p = freed_block(router, 1000, real);
  CHECK(d.calls("cuEventRecord") == 0);
  CHECK(d.calls("cuCtxSynchronize") == 0);
  CHECK(d.calls("cuMemFreeAsync") == 0);
  CHECK(router.snapshot(0).stats.ordered_frees == 1);

  CHECK(sync_alloc(router, 0, 1000, real) == p);
  CHECK(d.calls("cuEventRecord") == 3);      // legacy stream, app stream, the fence itself
  CHECK(d.calls("cuStreamWaitEvent") == 2);  // the free stream waits for both streams
  CHECK(d.calls("cuEventQuery") == 1);
  CHECK(d.calls("cuCtxSynchronize") == 0);  // no host stall anywhere
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.fences == 1);
  CHECK(s.stats.cache_hits == 1);
  CHECK(d.calls("cuMemAllocFromPoolAsync") == 1);
}

namespace {

// Free mode ordered with stream creation seen and no stream made; device 0 current.
struct LegacyRig : Rig {
  StreamRegistry streams;
  explicit LegacyRig(Config c = ordered_config()) : Rig(1, 64 * MiB, std::move(c)) {
    streams.mark_observed();
    router.set_stream_registry(&streams);
    d.make_current(0);
  }
  // The device's legacy barriers and event fences so far.
  void check_reuses(std::uint64_t legacy_reuses, std::uint64_t fences) {
    const DeviceSnapshot s = router.snapshot(0);
    CHECK(s.stats.legacy_reuses == legacy_reuses);
    CHECK(s.stats.fences == fences);
  }
  // A non-blocking stream made and listed as the shim's stream hook does.
  StreamRegistry::Entry list_stream() {
    StreamRegistry::Entry e{make_stream(d), 0, nullptr};
    REQUIRE(d.api.cuEventCreate(&e.event, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    router.after_stream_created();
    streams.add(e);
    router.after_stream_listed(e);
    return e;
  }
};

Config without_legacy_reuse() {
  Config c = ordered_config();
  c.legacy_reuse = false;
  return c;
}

}  // namespace

TEST_CASE(
    "heap: legacy rule, only the legacy stream in use: an ordered cudaFree's block serves the "
    "next cudaMalloc at once, with no event and no host stall") {
  LegacyRig rig;
  RealStub real;
  void* p = freed_block(rig.router, 1000, real);
  CHECK(sync_alloc(rig.router, 0, 1000, real) == p);
  CHECK(rig.d.calls("cuEventRecord") == 0);
  CHECK(rig.d.calls("cuStreamWaitEvent") == 0);
  CHECK(rig.d.calls("cuCtxSynchronize") == 0);
  rig.check_reuses(0, 0);
  CHECK(rig.router.snapshot(0).stats.cache_hits == 1);
}

TEST_CASE(
    "heap: legacy rule, blocking streams in use: one barrier on the legacy stream covers every "
    "block freed before it") {
  LegacyRig rig;
  rig.router.after_stream_created();  // a blocking stream was made: nothing to record yet
  CHECK(rig.d.calls("cuEventRecord") == 0);
  RealStub real;
  void* p = sync_alloc(rig.router, 0, 1000, real);
  void* q = sync_alloc(rig.router, 0, 1000, real);
  rig.router.free_sync(p, 0, real);
  rig.router.free_sync(q, 0, real);
  CHECK(sync_alloc(rig.router, 0, 1000, real) != nullptr);
  CHECK(rig.d.calls("cuEventRecord") == 1);  // the barrier, behind both frees
  CHECK(sync_alloc(rig.router, 0, 1000, real) != nullptr);
  CHECK(rig.d.calls("cuEventRecord") == 1);  // covered already
  rig.check_reuses(1, 0);
  void* r = freed_block(rig.router, 1000, real);
  CHECK(sync_alloc(rig.router, 0, 1000, real) == r);
  rig.check_reuses(2, 0);  // a free after the barrier needs the next one
}

TEST_CASE(
    "heap: legacy rule: the first stream the application makes ends the barrier-free case with "
    "one barrier behind the blocks handed out") {
  LegacyRig rig;
  RealStub real;
  void* p = freed_block(rig.router, 1000, real);
  CHECK(sync_alloc(rig.router, 0, 1000, real) == p);  // barrier-free
  rig.check_reuses(0, 0);
  rig.router.after_stream_created();
  CHECK(rig.d.calls("cuEventRecord") == 1);
  rig.check_reuses(1, 0);
  rig.router.after_stream_created();  // only the first stream does
  CHECK(rig.d.calls("cuEventRecord") == 1);
}

namespace {
bool a_capture_began() {
  return true;
}
}  // namespace

TEST_CASE(
    "heap: legacy rule: a handout that would record a barrier while a capture has begun "
    "elsewhere records nothing, and the real function answers") {
  LegacyRig rig;
  rig.router.after_stream_created();  // a blocking stream: handouts need a barrier
  RealStub real;
  void* p = freed_block(rig.router, 1000, real);  // legacy token, fence not completed
  const std::uint64_t cached = rig.router.snapshot(0).cached_bytes;
  // A capture counted after this call saw none (the hook's check) and before its handout.
  rig.router.set_capture_probe(&a_capture_began);
  CHECK(sync_alloc(rig.router, 0, 1000, real) == nullptr);  // passed to the real function
  CHECK(real.calls == 1);
  CHECK(real.last_request == 1000);
  CHECK(rig.d.calls("cuEventRecord") == 0);  // nothing joined the capture
  CHECK(rig.d.calls("cuCtxSynchronize") == 0);
  const DeviceSnapshot s = rig.router.snapshot(0);
  CHECK(s.stats.passthrough_allocs == 1);
  CHECK(s.cached_bytes == cached);  // the block went back as it was
  CHECK(s.stats.live_allocs.current == 0);
  rig.router.set_capture_probe(nullptr);  // the capture ended
  CHECK(sync_alloc(rig.router, 0, 1000, real) == p);
  CHECK(rig.d.calls("cuEventRecord") == 1);
  rig.check_reuses(1, 0);
}

TEST_CASE("heap: legacy_reuse=0: an ordered cudaFree's block waits for a fence") {
  LegacyRig rig(without_legacy_reuse());
  RealStub real;
  void* p = freed_block(rig.router, 1000, real);
  CHECK(sync_alloc(rig.router, 0, 1000, real) == p);  // the double's fence completes at once
  rig.check_reuses(0, 1);
}

TEST_CASE(
    "heap: legacy rule: a block cudaFree'd while a non-blocking stream exists never takes the "
    "legacy token") {
  LegacyRig rig;
  const StreamRegistry::Entry e = rig.list_stream();
  RealStub real;
  void* p = freed_block(rig.router, 1000, real);
  StreamRegistry::Entry removed;
  REQUIRE(rig.streams.remove(e.stream, &removed));  // gone before the next cudaMalloc
  CHECK(sync_alloc(rig.router, 0, 1000, real) == p);
  rig.check_reuses(0, 1);
}

TEST_CASE(
    "heap: legacy rule: after a non-blocking stream is destroyed, cudaFree'd blocks wait for a "
    "fence that covers its last work") {
  LegacyRig rig;
  RealStub real;
  void* p = sync_alloc(rig.router, 0, MiB, real);          // may be used on the stream below
  CHECK(sync_alloc(rig.router, 0, MiB, real) != nullptr);  // the segment is full
  const StreamRegistry::Entry e = rig.list_stream();       // nothing freed yet: nothing to record
  StreamRegistry::Entry removed;
  REQUIRE(rig.streams.remove(e.stream, &removed, [&](const StreamRegistry::Entry& x) {
    rig.router.wait_for_stream_at_destroy(x);
  }));
  rig.router.free_sync(p, 0, real);  // no stream listed any more, but it may still run
  rig.check_reuses(0, 0);
  CHECK(sync_alloc(rig.router, 0, MiB, real) == p);  // after a fence
  rig.check_reuses(0, 1);
  // That fence covered the destroyed stream: blocks freed from now on take the token again
  // (behind a barrier: a stream was made).
  void* q = freed_block(rig.router, MiB, real);
  CHECK(sync_alloc(rig.router, 0, MiB, real) == q);
  rig.check_reuses(1, 1);
}

TEST_CASE(
    "heap: legacy rule: while a non-blocking stream exists, cudaMalloc takes no block by the "
    "legacy token but cudaMallocAsync on stream 0 does") {
  LegacyRig rig;
  RealStub real;
  void* p = sync_alloc(rig.router, 0, 1000, real);
  void* q = sync_alloc(rig.router, 0, 70000, real);
  rig.router.free_sync(p, 0, real);  // both by the legacy token, no fence yet
  rig.router.free_sync(q, 0, real);
  rig.list_stream();  // the first stream: one barrier behind both
  rig.check_reuses(1, 0);
  // cudaMallocAsync on the legacy stream: the allocation's users are ordered behind that stream.
  CHECK(async_alloc(rig.router, 0, 1000, CU_STREAM_LEGACY, real) == p);
  rig.check_reuses(1, 0);
  // cudaMalloc's block may be used on the new stream, which that stream does not order: it
  // waits for a fence (the double's completes at once).
  CHECK(sync_alloc(rig.router, 0, 70000, real) == q);
  rig.check_reuses(1, 1);
}

TEST_CASE(
    "heap: legacy rule: only after a handout does a new non-blocking stream first wait for the "
    "legacy stream") {
  LegacyRig rig;
  RealStub real;
  const StreamRegistry::Entry e = rig.list_stream();  // no handout yet: no wait, no record
  CHECK(rig.d.calls("cuStreamWaitEvent") == 0);
  CHECK(rig.d.calls("cuEventRecord") == 0);
  StreamRegistry::Entry removed;
  REQUIRE(rig.streams.remove(e.stream, &removed));
  void* p = freed_block(rig.router, 1000, real);
  CHECK(sync_alloc(rig.router, 0, 1000, real) == p);  // the handout: one barrier
  REQUIRE(rig.d.calls("cuEventRecord") == 1);
  rig.list_stream();
  CHECK(rig.d.calls("cuStreamWaitEvent") == 1);  // the new stream waits for that record
  CHECK(rig.d.calls("cuEventRecord") == 1);      // and records nothing
  CHECK(rig.d.calls("cuEventQuery") == 0);
}

TEST_CASE("heap: out of memory gives whole free segments back to the pool before the retry") {
  Rig rig(1, 64 * MiB, with_cache(64 * MiB, testing::with_segments()));
  auto& [d, config, events, router] = rig;
  RealStub real;
  freed_block(router, 40 * MiB, real);
  CHECK(router.snapshot(0).cached_bytes == 40 * MiB);
  void* q = sync_alloc(router, 0, 41 * MiB, real);  // 40 + 42 MiB of segments > 64 MiB
  CHECK(q != nullptr);
  CHECK(real.calls == 0);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.oom_retries == 1);
  CHECK(s.stats.oom_retry_successes == 1);
  CHECK(s.stats.cache_returns == 1);
  CHECK(s.cached_bytes == 1 * MiB);  // the new segment's rest
  CHECK(s.pool.reserved == 42 * MiB);
}

TEST_CASE("heap: cudaMemGetInfo counts the heap's free blocks as free") {
  Rig rig(1, 64 * MiB, with_cache(64 * MiB));
  auto& [d, config, events, router] = rig;
  RealStub real;
  freed_block(router, MiB, real);
  std::size_t free = 10 * MiB;
  std::size_t total = 64 * MiB;
  router.adjust_memory_info(0, &free, &total);
  CHECK(free == 10 * MiB + 2 * MiB);  // the whole free segment
  CHECK(total == 64 * MiB);
}

TEST_CASE(
    "heap: a second free answers natively, and never with a segment's base, which would free "
    "the segment under its live blocks") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* p = sync_alloc(router, 0, 1000, real);  // the segment's first block: its base
  void* q = sync_alloc(router, 0, 1000, real);
  router.free_sync(p, 0, real);
  router.free_sync(q, 0, real);
  RealStub second;
  router.free_sync(p, 0, second);
  CHECK(second.calls == 1);  // the real cudaFree answers (cudaErrorInvalidValue natively)
  CHECK(second.last_pointer == static_cast<char*>(p) + 256);
  router.free_sync(q, 0, second);
  CHECK(second.last_pointer == q);  // no segment starts there: the pointer itself
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.passthrough_frees == 2);
  CHECK(s.stats.frees == 2);
  CHECK(s.cached_bytes == 2 * MiB);
  CHECK(d.calls("cuMemFreeAsync") == 0);
}

TEST_CASE("heap: cudaDeviceReset forgets the heap's segments") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  freed_block(router, 1000, real);
  router.before_device_reset(0);
  CHECK(router.snapshot(0).cached_bytes == 0);
  CHECK(d.calls("cuMemFreeAsync") == 0);  // the reset frees the pool's memory itself
}

TEST_CASE("heap: many threads allocating and freeing leave every byte accounted for") {
  Rig rig(1, 256 * MiB, without_cache());
  Router& router = rig.router;
  std::vector<std::thread> threads;
  std::atomic<int> real_calls{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto real = [&](auto&&...) {
        real_calls.fetch_add(1);
        return RealResult::success;
      };
      for (int i = 0; i < 200; ++i) {
        void* p = sync_alloc(router, 0, 256 + 4096 * ((i * 7 + t) % 16), real);
        router.free_sync(p, 0, real);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(real_calls.load() == 0);
  DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.allocs == 1600);
  CHECK(s.stats.frees == 1600);
  CHECK(s.stats.cache_hits + s.stats.cache_misses == 1600);
  // Every segment came from a miss; a miss may still find a block that another thread freed
  // meanwhile (how many depends on the threads' interleaving).
  CHECK(s.stats.cache_misses >= rig.d.calls("cuMemAllocFromPoolAsync"));
  CHECK(s.stats.cache_hits > 0);
  CHECK(s.stats.live_allocs.current == 0);
  router.tend_heap(0, now_ns());  // cache=0: every whole free segment goes back
  s = router.snapshot(0);
  CHECK(s.cached_bytes == 0);
  CHECK(s.pool.used == 0);
}

TEST_CASE("heap: a stream's device is asked of the driver once, until a stream is destroyed") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  d.make_current(0);
  const CUstream s1 = make_stream(d);
  CHECK(router.stream_device(s1) == 0);
  CHECK(router.stream_device(s1) == 0);
  CHECK(d.calls("cuStreamGetDevice") == 1);
  router.before_any_stream_destroy(make_stream(d));  // any stream: handles can be reused
  CHECK(router.stream_device(s1) == 0);
  CHECK(d.calls("cuStreamGetDevice") == 2);
}

TEST_CASE(
    "heap: a cudaFreeAsync on another device's default stream waits for that stream, then the "
    "block is free for every stream") {
  Rig rig(2, 64 * MiB);
  auto& [d, config, events, router] = rig;
  d.make_current(0);
  RealStub real;
  void* p = async_alloc(router, 0, 4096, nullptr, real);
  REQUIRE(p != nullptr);
  REQUIRE(d.calls("cuStreamSynchronize") == 1);  // the segment's
  d.make_current(1);  // device 1's legacy stream never orders device 0's work
  router.free_async(p, nullptr, real);
  CHECK(d.calls("cuStreamSynchronize") == 2);
  CHECK(d.calls("cuMemFreeAsync") == 0);
  CHECK(router.snapshot(0).cached_bytes == 2 * MiB);
  CHECK(router.snapshot(0).stats.frees == 1);
}

TEST_CASE("heap: an idle trim synchronizes once for blocks no event fence can reach") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  CUstream s1 = nullptr;
  RealStub real;
  freed_on_new_stream(rig, streams, &s1, real);
  CHECK(router.tend_heap(0, now_ns()) == 0);  // its fence has not completed: not given back
  router.trim_idle(0, 0);
  CHECK(d.calls("cuCtxSynchronize") == 1);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.cached_bytes == 0);
  CHECK(s.stats.cache_returns == 1);
  CHECK(s.pool.reserved == 0);
}

TEST_CASE(
    "heap: bounded memory: when 64 MiB or more only wait for a fence, a miss synchronizes once "
    "instead of growing") {
  Rig rig(1, 512 * MiB, with_cache(512 * MiB, testing::with_segments()));
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  wait_then_ask_elsewhere(rig, streams, 6);  // 72 MiB waiting
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.bounded_syncs == 1);
  CHECK(d.calls("cuCtxSynchronize") == 1);
  CHECK(s.pool.reserved == 72 * MiB);  // no growth
}

TEST_CASE("heap: under 64 MiB waiting for a fence, a miss grows instead of stalling the host") {
  Rig rig(1, 512 * MiB, with_cache(512 * MiB, testing::with_segments()));
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  wait_then_ask_elsewhere(rig, streams, 4);  // 48 MiB waiting
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.bounded_syncs == 0);
  CHECK(d.calls("cuCtxSynchronize") == 0);
  CHECK(s.pool.reserved == 60 * MiB);
}

namespace {

// Another thread, alive until `done` is set, allocates `count` 12 MiB blocks on its own stream
// and frees them with cudaFree (sync mode: ready for every stream at once), into its arena.
struct LiveNeighbour {
  std::atomic<bool> freed{false};
  std::atomic<bool> done{false};
  std::vector<void*> blocks;
  std::thread thread;
  LiveNeighbour(Rig& rig, int count) {
    thread = std::thread([this, &rig, count] {
      rig.d.make_current(0);
      RealStub real;
      const CUstream s1 = make_stream(rig.d);
      for (int i = 0; i < count; ++i) {
        blocks.push_back(async_alloc(rig.router, 0, 12 * MiB, s1, real));
      }
      for (void* b : blocks) rig.router.free_sync(b, 0, real);
      freed.store(true);
      while (!done.load()) std::this_thread::yield();
    });
    while (!freed.load()) std::this_thread::yield();
  }
  void exit() {
    done.store(true);
    thread.join();
  }
  ~LiveNeighbour() {
    if (thread.joinable()) exit();
  }
};

// A rig whose named streams are seen (they keep their tokens and their threads' arenas), a
// live neighbour with `blocks` 12 MiB blocks free in its arena, the arenas' activity period
// turned `turns` times (none: nothing idle yet; 1: the neighbour's requests fell in the period
// that ended, it is active; 2: a whole period without one, idle), and this thread's stream.
struct BesideNeighbour {
  Rig rig;
  StreamRegistry streams;
  std::unique_ptr<LiveNeighbour> neighbour;  // declared after rig: exits before it goes
  CUstream s2 = nullptr;
  RealStub real;
  BesideNeighbour(std::uint64_t device_bytes, int blocks, int turns)
      : rig(1, device_bytes, with_cache(512 * MiB, testing::with_segments())) {
    streams.mark_observed();
    rig.router.set_stream_registry(&streams);
    neighbour = std::make_unique<LiveNeighbour>(rig, blocks);
    for (int i = 0; i < turns; ++i) rig.router.tend_heap(0, 1 + i * ArenaActivity::kPeriodNs);
    rig.d.make_current(0);
    s2 = make_stream(rig.d);
  }
  void* allocate() { return async_alloc(rig.router, 0, 12 * MiB, s2, real); }
  bool neighbours(void* p) const {
    return std::find(neighbour->blocks.begin(), neighbour->blocks.end(), p) !=
           neighbour->blocks.end();
  }
  DeviceSnapshot snapshot() { return rig.router.snapshot(0); }
};

}  // namespace

TEST_CASE(
    "heap: under 64 MiB free in a live thread's arena, another thread grows its own arena "
    "rather than lock it, once that thread has exited, its memory serves") {
  BesideNeighbour t(512 * MiB, 4, 0);  // 48 MiB free in its arena
  REQUIRE(t.snapshot().pool.reserved == 48 * MiB);
  void* mine = t.allocate();
  CHECK(t.snapshot().pool.reserved == 60 * MiB);  // grown by one 12 MiB segment
  CHECK_FALSE(t.neighbours(mine));
  t.neighbour->exit();
  void* next = t.allocate();
  CHECK(t.snapshot().pool.reserved == 60 * MiB);  // the exited thread's block, no growth
  CHECK(t.neighbours(next));
  CHECK(t.snapshot().stats.bounded_syncs == 0);
}

TEST_CASE(
    "heap: bounded memory: from 64 MiB free in a live thread's arena idle for a period (and an "
    "eighth of the heap), another thread's miss takes it instead of growing") {
  BesideNeighbour t(512 * MiB, 6, 2);  // 72 MiB free in its idle arena
  void* mine = t.allocate();
  CHECK(t.snapshot().pool.reserved == 72 * MiB);  // no growth
  CHECK(t.neighbours(mine));
  CHECK(t.snapshot().stats.bounded_syncs == 0);  // ready: no synchronization needed
}

TEST_CASE(
    "heap: a live thread's arena that made requests in the last period keeps its free memory: "
    "another thread's miss grows its own arena, with no synchronization") {
  BesideNeighbour t(512 * MiB, 6, 1);  // 72 MiB free in its active arena, its working set
  const auto syncs = t.rig.d.calls("cuCtxSynchronize");  // the neighbour's cudaFree calls made 6
  void* mine = t.allocate();
  CHECK(t.snapshot().pool.reserved == 84 * MiB);  // grown by one 12 MiB segment
  CHECK_FALSE(t.neighbours(mine));
  CHECK(t.snapshot().stats.bounded_syncs == 0);
  CHECK(t.rig.d.calls("cuCtxSynchronize") == syncs);
}

TEST_CASE(
    "heap: out of memory, a free block of a live thread's active arena serves the retry before "
    "any segment goes back") {
  BesideNeighbour t(80 * MiB, 6, 1);  // 72 MiB of the device's 80 free in its active arena
  void* mine = t.allocate();          // 12 MiB more would not fit
  REQUIRE(mine != nullptr);
  CHECK(t.neighbours(mine));
  const DeviceSnapshot s = t.snapshot();
  CHECK(s.pool.reserved == 72 * MiB);
  CHECK(s.stats.oom_retries == 1);
  CHECK(s.stats.oom_retry_successes == 1);
  CHECK(s.stats.cache_returns == 0);  // nothing given back: the free block served
  CHECK(t.real.calls == 0);
}

TEST_CASE(
    "heap: a cudaFreeAsync on a capturing stream is answered on the proxy and its block is "
    "never reused: a graph holds the free") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  streams.mark_observed();
  router.set_stream_registry(&streams);
  d.make_current(0);
  const CUstream s = make_stream(d);
  RealStub real;
  void* p = async_alloc(router, 0, 4096, s, real);
  router.before_capture();
  auto* begin = d.function<decltype(::cuStreamBeginCapture_v2)>("cuStreamBeginCapture_v2");
  auto* end = d.function<decltype(::cuStreamEndCapture)>("cuStreamEndCapture");
  REQUIRE(begin(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  router.free_unrouted(p, 0, real, true, s);
  CHECK(real.calls == 1);
  CHECK(real.last_pointer != p);  // the proxy
  CUgraph g = nullptr;
  CHECK(end(s, &g) == CUDA_SUCCESS);
  const DeviceSnapshot snap = router.snapshot(0);
  CHECK(snap.stats.retired_blocks == 1);
  CHECK(snap.stats.live_allocs.current == 0);
  CHECK(snap.cached_bytes == 2 * MiB - 4096);  // p stays out of use
  CHECK(async_alloc(router, 0, 4096, s, real) != p);
}

TEST_CASE(
    "heap: after a kernel fault, cudaMalloc and cudaFreeAsync reach the real function, which "
    "returns the sticky error, as natively") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  d.make_current(0);
  RealStub real;
  freed_block(router, 1000, real);  // the heap now holds a free block
  void* q = async_alloc(router, 0, 4096, nullptr, real);
  void* r = sync_alloc(router, 0, 2000, real);
  REQUIRE(q != nullptr);
  REQUIRE(r != nullptr);
  d.fault();
  RealStub failing{RealResult::error};
  router.free_sync(r, 0, failing);  // the synchronization fails: noted; the real free answers
  CHECK(failing.calls == 1);
  CHECK(sync_alloc(router, 0, 1000, failing) == nullptr);  // not served from the heap
  CHECK(failing.calls == 2);
  router.free_async(q, nullptr, failing);
  CHECK(failing.calls == 3);
  CHECK(router.live_allocations().size() == 2);  // q and r are still live: their frees failed
}

TEST_CASE("stats: a histogram bucket read between an allocation and its free never wraps") {
  DeviceStats stats;
  stats.shards[1].histogram[12].fetch_sub(1);  // the free, on a shard read after...
  StatsSnapshot snap = take_snapshot(stats);   // ...the allocation's shard was read as 0
  CHECK(snap.histogram[12] == 0);
  stats.shards[0].histogram[12].fetch_add(2);
  snap = take_snapshot(stats);
  CHECK(snap.histogram[12] == 1);
}

namespace {

// A stream s1 listed with its event (event fences possible; the double's events complete at
// once), and a 4 KiB block allocated and freed on it: it serves s1 at once and every other
// stream after a fence, which no hit and no free starts.
void freed_on_fenced_stream(Rig& rig, StreamRegistry& streams) {
  streams.mark_observed();
  rig.router.set_stream_registry(&streams);
  rig.d.make_current(0);
  const CUstream s1 = make_stream(rig.d);
  CUevent e = nullptr;
  REQUIRE(rig.d.api.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  streams.add({s1, 0, e});
  RealStub real;
  void* p = async_alloc(rig.router, 0, 4096, s1, real);
  REQUIRE(p != nullptr);
  rig.router.free_async(p, s1, real);
  REQUIRE(rig.router.snapshot(0).stats.fences == 0);
  REQUIRE(rig.router.snapshot(0).cached_bytes == 2 * MiB);
}

bool capture_in_progress() {
  return true;
}

}  // namespace

TEST_CASE(
    "heap: the background tick starts the fence of blocks freed on a non-blocking stream, and "
    "trims them once it completes") {
  Rig rig(1, 64 * MiB, with_cache(0));
  StreamRegistry streams;
  freed_on_fenced_stream(rig, streams);
  const unsigned long long records = rig.d.calls("cuEventRecord");
  // The double's event is done at once: started, completed, and the segment given back.
  CHECK(rig.router.tend_heap(0, now_ns()) == 2 * MiB);
  const DeviceSnapshot s = rig.router.snapshot(0);
  CHECK(s.stats.fences == 1);
  CHECK(rig.d.calls("cuEventRecord") == records + 3);  // legacy stream, s1, the free stream
  CHECK(rig.d.calls("cuCtxSynchronize") == 0);         // no host stall
  CHECK(s.cached_bytes == 0);
  CHECK(s.pool.used == 0);
}

TEST_CASE("heap: the background tick starts no fence while a capture is in progress") {
  Rig rig(1, 64 * MiB, with_cache(0));
  StreamRegistry streams;
  freed_on_fenced_stream(rig, streams);
  const unsigned long long records = rig.d.calls("cuEventRecord");
  rig.router.set_capture_probe(&capture_in_progress);
  CHECK(rig.router.tend_heap(0, now_ns()) == 0);
  CHECK(rig.d.calls("cuEventRecord") == records);  // nothing recorded on any stream
  CHECK(rig.router.snapshot(0).stats.fences == 0);
  CHECK(rig.router.snapshot(0).cached_bytes == 2 * MiB);
  rig.router.set_capture_probe(nullptr);  // the capture ended
  CHECK(rig.router.tend_heap(0, now_ns()) == 2 * MiB);
}
