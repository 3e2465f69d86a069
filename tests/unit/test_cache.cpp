// The user-space cache in front of the pool (issue 6): reuse without a driver call, exactly as
// safe as the driver's own reuse.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "block_cache.h"
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

namespace {

Config with_cache(std::uint64_t bytes, Config c = Config::defaults()) {
  c.cache = SizeValue{bytes, 0.0, false};
  return c;
}

CachedBlock block_at(CUdeviceptr ptr, std::uint64_t capacity, std::uint64_t ready_at) {
  return CachedBlock{ptr, capacity, nullptr, ready_at, 0};
}

// cudaMalloc then cudaFree of `bytes` on device 0: the block goes to the cache.
template <typename Real>
void* cached_block(Router& router, std::size_t bytes, Real& real) {
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

}  // namespace

TEST_CASE("cache: four size classes per power of two") {
  CHECK(BlockCache::class_of(1) == 0);
  CHECK(BlockCache::class_of(3) == 4);
  CHECK(BlockCache::class_of(256) == 32);
  CHECK(BlockCache::class_of(320) == 33);
  CHECK(BlockCache::class_of(384) == 34);
  CHECK(BlockCache::class_of(511) == 35);
  CHECK(BlockCache::class_of(512) == 36);
  CHECK(BlockCache::class_of(std::uint64_t{1} << 62) == BlockCache::kClasses - 1);
  CHECK(BlockCache::largest_fit(800) == 1000);
}

TEST_CASE("cache: a full class gives up its oldest ready block for a new one") {
  BlockCache cache(std::uint64_t{1} << 30);
  CachedBlock evicted;
  for (int i = 0; i < BlockCache::kSlots; ++i) {
    REQUIRE(cache.put(block_at(0x1000 * (i + 1), 1000, 1), 1, &evicted));
    CHECK(evicted.ptr == 0);
  }
  REQUIRE(cache.put(block_at(0x100000, 1000, 1), 1, &evicted));
  CHECK(evicted.ptr == 0x1000);
  CHECK(cache.bytes() == BlockCache::kSlots * 1000);
}

TEST_CASE("cache: a full class of blocks still waiting for a fence keeps none more") {
  BlockCache cache(std::uint64_t{1} << 30);
  CachedBlock evicted;
  for (int i = 0; i < BlockCache::kSlots; ++i) {
    REQUIRE(cache.put(block_at(0x1000 * (i + 1), 1000, 9), 1, &evicted));
  }
  CHECK_FALSE(cache.put(block_at(0x100000, 1000, 1), 1, &evicted));
  CHECK(cache.bytes() == BlockCache::kSlots * 1000);
}

TEST_CASE("cache: the byte limit bounds what is kept") {
  BlockCache cache(4096);
  CachedBlock evicted;
  CHECK(cache.put(block_at(0x1000, 4096, 1), 1, &evicted));
  CHECK_FALSE(cache.put(block_at(0x2000, 1, 1), 1, &evicted));
  CHECK(cache.bytes() == 4096);
}

TEST_CASE(
    "cache: a block freed by cudaFree serves the next fitting cudaMalloc without a driver "
    "call") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* p = cached_block(router, 1000, real);
  CHECK(d.calls("cuCtxSynchronize") == 1);  // cudaFree's native synchronization, the fence
  CHECK(d.calls("cuMemFreeAsync") == 0);    // kept, not freed
  DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.frees == 1);
  CHECK(s.stats.live_allocs.current == 0);
  CHECK(s.cached_bytes == 1000);
  CHECK(s.pool.used == 1024);  // still in use to the driver
  CHECK(router.unused_bytes(0) == 2 * MiB - 1024 + 1000);

  void* q = sync_alloc(router, 0, 1000, real);
  CHECK(q == p);
  CHECK(real.calls == 0);
  CHECK(d.calls("cuMemAllocFromPoolAsync") == 1);
  CHECK(d.calls("cuStreamSynchronize") == 1);  // only the first allocation's
  s = router.snapshot(0);
  CHECK(s.stats.allocs == 2);
  CHECK(s.stats.cache_hits == 1);
  CHECK(s.stats.cache_misses == 1);
  CHECK(s.cached_bytes == 0);
  CHECK(s.cached_bytes_peak == 1000);
  CHECK(s.stats.live_allocs.current == 1);
}

TEST_CASE("cache: a block serves requests up to a quarter smaller than itself, never larger") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* p = cached_block(router, 1000, real);
  CHECK(sync_alloc(router, 0, 1001, real) != p);  // larger than the block
  CHECK(sync_alloc(router, 0, 799, real) != p);   // the block is over 5/4 of it
  CHECK(sync_alloc(router, 0, 800, real) == p);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.cache_hits == 1);
  CHECK(s.stats.requested_bytes.current == 1001 + 799 + 800);
  CHECK(d.calls("cuMemAllocFromPoolAsync") == 3);
}

TEST_CASE(
    "cache: a block freed on a stream serves that stream at once, another only after a "
    "fence") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  streams_without_event_fences(rig, streams);
  const CUstream s1 = make_stream(d);
  const CUstream s2 = make_stream(d);
  RealStub real;
  void* p = async_alloc(router, 0, 4096, s1, real);
  router.free_async(p, s1, real);
  CHECK(d.calls("cuMemFreeAsync") == 0);
  void* q = async_alloc(router, 0, 4096, s2, real);
  CHECK(q != p);  // s2 is not ordered behind s1's use of p
  void* r = async_alloc(router, 0, 4096, s1, real);
  CHECK(r == p);  // s1 is
  CHECK(d.calls("cuMemAllocFromPoolAsync") == 2);

  router.free_async(r, s1, real);                      // waits for a fence to serve s2
  router.free_sync(q, 0, real);                        // synchronizes the device: a fence
  CHECK(async_alloc(router, 0, 4096, s2, real) == q);  // the newest ready block first
  CHECK(async_alloc(router, 0, 4096, s2, real) == p);  // freed on s1 before the fence
  CHECK(router.snapshot(0).stats.cache_hits == 3);
  CHECK(router.snapshot(0).stats.fences == 0);
  CHECK(real.calls == 0);
}

TEST_CASE("cache: without seeing stream destruction a named stream gets no shortcut") {
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
  CHECK(router.snapshot(0).cached_bytes == 4096);
}

TEST_CASE("cache: the legacy default stream's blocks serve it at once") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  d.make_current(0);
  RealStub real;
  void* p = async_alloc(router, 0, 4096, nullptr, real);
  router.free_async(p, nullptr, real);
  CHECK(async_alloc(router, 0, 4096, CU_STREAM_LEGACY, real) == p);
}

TEST_CASE("cache: a destroyed stream's blocks lose the shortcut") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  streams_without_event_fences(rig, streams);
  const CUstream s1 = make_stream(d);
  RealStub real;
  void* p = async_alloc(router, 0, 4096, s1, real);
  router.free_async(p, s1, real);
  router.before_any_stream_destroy(s1);  // a new stream may get the same handle
  CHECK(async_alloc(router, 0, 4096, s1, real) != p);
  CHECK(router.snapshot(0).cached_bytes == 4096);
}

TEST_CASE(
    "cache: an ordered cudaFree makes no driver call; cudaMalloc takes the block once an "
    "event fence behind every stream has completed") {
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
  void* p = cached_block(router, 1000, real);
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

// Free mode ordered with stream creation seen and no stream listed; device 0 current.
Config legacy_reuse_config() {
  Config c = ordered_config();
  c.legacy_reuse = true;
  return c;
}

struct LegacyRig : Rig {
  StreamRegistry streams;
  explicit LegacyRig(Config c = legacy_reuse_config()) : Rig(1, 64 * MiB, std::move(c)) {
    streams.mark_observed();
    router.set_stream_registry(&streams);
    d.make_current(0);
  }
  // The device's legacy-barrier reuses and event fences so far.
  void check_reuses(std::uint64_t legacy_reuses, std::uint64_t fences) {
    const DeviceSnapshot s = router.snapshot(0);
    CHECK(s.stats.legacy_reuses == legacy_reuses);
    CHECK(s.stats.fences == fences);
  }
  // A non-blocking stream made and listed as the shim's stream hook does.
  StreamRegistry::Entry list_stream() {
    StreamRegistry::Entry e{make_stream(d), 0, nullptr};
    REQUIRE(d.api.cuEventCreate(&e.event, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    streams.add(e);
    router.after_stream_listed(e);
    return e;
  }
};

}  // namespace

TEST_CASE(
    "cache: legacy_reuse: without a non-blocking stream an ordered cudaFree's block serves the "
    "next cudaMalloc at once, behind one event recorded on the legacy stream") {
  LegacyRig rig;
  RealStub real;
  void* p = cached_block(rig.router, 1000, real);
  CHECK(rig.d.calls("cuEventRecord") == 0);  // the free itself records nothing
  CHECK(sync_alloc(rig.router, 0, 1000, real) == p);
  CHECK(rig.d.calls("cuEventRecord") == 1);  // the barrier on the legacy stream, no fence
  CHECK(rig.d.calls("cuStreamWaitEvent") == 0);
  CHECK(rig.d.calls("cuEventQuery") == 0);
  rig.check_reuses(1, 0);
  CHECK(rig.router.snapshot(0).stats.cache_hits == 1);
}

TEST_CASE("cache: legacy_reuse=0 (the default): an ordered cudaFree's block waits for a fence") {
  LegacyRig rig(ordered_config());
  RealStub real;
  void* p = cached_block(rig.router, 1000, real);
  CHECK(sync_alloc(rig.router, 0, 1000, real) == p);  // the double's fence completes at once
  rig.check_reuses(0, 1);
}

TEST_CASE(
    "cache: legacy_reuse: a block cudaFree'd while a non-blocking stream exists never takes the "
    "legacy shortcut") {
  LegacyRig rig;
  const StreamRegistry::Entry e = rig.list_stream();
  RealStub real;
  void* p = cached_block(rig.router, 1000, real);
  StreamRegistry::Entry removed;
  REQUIRE(rig.streams.remove(e.stream, &removed));  // gone before the next cudaMalloc
  CHECK(sync_alloc(rig.router, 0, 1000, real) == p);
  rig.check_reuses(0, 1);
}

TEST_CASE(
    "cache: legacy_reuse: after a non-blocking stream is destroyed, cudaFree'd blocks wait for a "
    "fence that covers its last work") {
  LegacyRig rig;
  RealStub real;
  void* p = sync_alloc(rig.router, 0, 1000, real);  // may be used on the stream below
  const StreamRegistry::Entry e = rig.list_stream();
  StreamRegistry::Entry removed;
  REQUIRE(rig.streams.remove(e.stream, &removed, [&](const StreamRegistry::Entry& x) {
    rig.router.wait_for_stream_at_destroy(x);
  }));
  rig.router.free_sync(p, 0, real);  // no stream listed any more
  CHECK(sync_alloc(rig.router, 0, 1000, real) == p);
  rig.check_reuses(0, 1);
  // That fence covered the destroyed stream: blocks freed from now on take the shortcut.
  void* q = cached_block(rig.router, 5000, real);
  CHECK(sync_alloc(rig.router, 0, 5000, real) == q);
  rig.check_reuses(1, 1);
}

TEST_CASE(
    "cache: legacy_reuse: while a non-blocking stream exists, cudaMalloc takes no block behind "
    "the barrier but cudaMallocAsync on stream 0 does") {
  LegacyRig rig;
  RealStub real;
  void* p = sync_alloc(rig.router, 0, 1000, real);
  void* q = sync_alloc(rig.router, 0, 70000, real);
  rig.router.free_sync(p, 0, real);  // both kept behind the legacy barrier, no fence yet
  rig.router.free_sync(q, 0, real);
  rig.list_stream();
  // cudaMallocAsync on the legacy stream: the allocation's users are ordered behind that stream.
  CHECK(async_alloc(rig.router, 0, 1000, CU_STREAM_LEGACY, real) == p);
  rig.check_reuses(1, 0);
  // cudaMalloc's block may be used on the new stream, which that stream does not order: it
  // waits for a fence (the double's completes at once).
  CHECK(sync_alloc(rig.router, 0, 70000, real) == q);
  rig.check_reuses(1, 1);
}

TEST_CASE(
    "cache: legacy_reuse: only after a barrier handout does a new non-blocking stream first wait "
    "for the legacy stream") {
  LegacyRig rig;
  RealStub real;
  const StreamRegistry::Entry e = rig.list_stream();  // no handout yet: no wait
  CHECK(rig.d.calls("cuStreamWaitEvent") == 0);
  StreamRegistry::Entry removed;
  REQUIRE(rig.streams.remove(e.stream, &removed));
  void* p = cached_block(rig.router, 1000, real);
  CHECK(sync_alloc(rig.router, 0, 1000, real) == p);  // the handout: one record
  REQUIRE(rig.d.calls("cuEventRecord") == 1);
  rig.list_stream();
  CHECK(rig.d.calls("cuStreamWaitEvent") == 1);  // the new stream waits for that record
  CHECK(rig.d.calls("cuEventRecord") == 1);      // and records nothing
  CHECK(rig.d.calls("cuEventQuery") == 0);
}

TEST_CASE("cache: out of memory gives the cached blocks back to the pool before the retry") {
  Rig rig(1, 64 * MiB, with_cache(64 * MiB));
  auto& [d, config, events, router] = rig;
  RealStub real;
  cached_block(router, 40 * MiB, real);
  CHECK(router.snapshot(0).cached_bytes == 40 * MiB);
  void* q = sync_alloc(router, 0, 41 * MiB, real);  // 40 + 42 MiB of chunks > 64 MiB
  CHECK(q != nullptr);
  CHECK(real.calls == 0);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.oom_retries == 1);
  CHECK(s.stats.oom_retry_successes == 1);
  CHECK(s.stats.cache_returns == 1);
  CHECK(s.cached_bytes == 0);
  CHECK(s.pool.reserved == 42 * MiB);
}

TEST_CASE("cache: cudaMemGetInfo counts cached blocks as free") {
  Rig rig(1, 64 * MiB, with_cache(64 * MiB));
  auto& [d, config, events, router] = rig;
  RealStub real;
  cached_block(router, MiB, real);
  std::size_t free = 10 * MiB;
  std::size_t total = 64 * MiB;
  router.adjust_memory_info(0, &free, &total);
  CHECK(free == 10 * MiB + MiB + MiB);  // the chunk's unused half and the cached block
  CHECK(total == 64 * MiB);
}

TEST_CASE(
    "cache: a second free of a cached block answers natively and the block leaves the "
    "cache") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* p = cached_block(router, 1000, real);
  RealStub second;
  router.free_sync(p, 0, second);
  CHECK(second.calls == 1);  // the real cudaFree answers (cudaErrorInvalidValue natively)
  CHECK(d.calls("cuMemFreeAsync") == 1);  // the block went back to the pool first
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.stats.passthrough_frees == 1);
  CHECK(s.cached_bytes == 0);
  CHECK(s.stats.cache_returns == 1);
  CHECK(s.stats.frees == 1);
}

TEST_CASE("cache: a block over the cache's limit goes straight back to the pool") {
  Rig rig(1, 64 * MiB, with_cache(4096));
  auto& [d, config, events, router] = rig;
  RealStub real;
  cached_block(router, 8192, real);
  CHECK(d.calls("cuMemFreeAsync") == 1);
  CHECK(router.snapshot(0).cached_bytes == 0);
  CHECK(router.snapshot(0).pool.used == 0);
}

TEST_CASE("cache: blocks not reused for cache_age_ms go back to the pool") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  cached_block(router, 1000, real);
  const std::uint64_t second = 1000000000ULL;
  CHECK(router.tend_cache(0, now_ns(), second) == 0);  // too young
  CHECK(router.tend_cache(0, now_ns() + 3 * second, second) == 1000);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.cached_bytes == 0);
  CHECK(s.stats.cache_returns == 1);
  CHECK(s.pool.used == 0);
}

TEST_CASE("cache: cudaDeviceReset forgets the cached blocks") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  cached_block(router, 1000, real);
  router.before_device_reset(0);
  CHECK(router.snapshot(0).cached_bytes == 0);
  CHECK(d.calls("cuMemFreeAsync") == 0);  // the reset frees the pool's memory itself
}

TEST_CASE("cache: many threads allocating and freeing leave every byte accounted for") {
  Rig rig(1, 256 * MiB);
  Router& router = rig.router;
  std::vector<std::thread> threads;
  std::atomic<int> real_calls{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto real = [&] {
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
  CHECK(s.stats.cache_hits > 0);
  CHECK(s.stats.live_allocs.current == 0);
  router.tend_cache(0, now_ns() + 10000000000ULL, 1);  // age every block out
  s = router.snapshot(0);
  CHECK(s.cached_bytes == 0);
  CHECK(s.pool.used == 0);
}

TEST_CASE("cache: when a miss makes the pool grow, ready blocks worth the growth go back to it") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  void* small = sync_alloc(router, 0, MiB, real);  // one 2 MiB chunk
  router.free_sync(small, 0, real);
  void* big = sync_alloc(router, 0, 3 * MiB, real);  // a miss: the pool reserves a 4 MiB chunk
  REQUIRE(big != nullptr);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.pool.reserved == 6 * MiB);
  CHECK(s.stats.cache_returns == 1);  // the 1 MiB block, all there was
  CHECK(s.cached_bytes == 0);
}

TEST_CASE("cache: a miss the pool serves from memory it holds keeps the cached blocks") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  RealStub real;
  cached_block(router, 1000, real);
  CHECK(sync_alloc(router, 0, 5000, real) != nullptr);  // fits the 2 MiB chunk: no growth
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.pool.reserved == 2 * MiB);
  CHECK(s.stats.cache_returns == 0);
  CHECK(s.cached_bytes == 1000);
}

TEST_CASE("cache: a stream's device is asked of the driver once, until a stream is destroyed") {
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

TEST_CASE("cache: a cudaFreeAsync on another device's default stream is freed natively") {
  Rig rig(2, 64 * MiB);
  auto& [d, config, events, router] = rig;
  d.make_current(0);
  RealStub real;
  void* p = async_alloc(router, 0, 4096, nullptr, real);
  REQUIRE(p != nullptr);
  d.make_current(1);  // device 1's legacy stream never orders device 0's work
  router.free_async(p, nullptr, real);
  CHECK(d.calls("cuMemFreeAsync") == 1);
  CHECK(router.snapshot(0).cached_bytes == 0);
  CHECK(router.snapshot(0).stats.frees == 1);
}

TEST_CASE("cache: an idle trim synchronizes once for blocks no event fence can reach") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  StreamRegistry streams;
  streams_without_event_fences(rig, streams);
  const CUstream s1 = make_stream(d);
  RealStub real;
  void* p = async_alloc(router, 0, 4096, s1, real);
  router.free_async(p, s1, real);
  CHECK(router.tend_cache(0, now_ns() + 10000000000ULL, 1) == 0);  // not ready: not aged out
  router.trim_idle(0, 0);
  CHECK(d.calls("cuCtxSynchronize") == 1);
  const DeviceSnapshot s = router.snapshot(0);
  CHECK(s.cached_bytes == 0);
  CHECK(s.stats.cache_returns == 1);
  CHECK(s.pool.reserved == 0);
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
