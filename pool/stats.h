// Per-device statistics (DESIGN §5). Each counter is listed once in the X-macros below; the
// atomic struct, the snapshot, the JSON fields and the README schema (checked by a test) come
// from them. Hooks update them with relaxed atomics: no lock, no allocation.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace poolshim {

// X(name, meaning): monotonic totals since start (or since the device was reset).
#define POOLSHIM_COUNTERS(X)                                                                    \
  X(allocs, "allocations served from the pool (cudaMalloc and cudaMallocAsync)")                \
  X(frees, "pooled blocks given back (cudaFree and cudaFreeAsync)")                             \
  X(async_allocs, "of allocs, those made by cudaMallocAsync")                                   \
  X(async_frees, "of frees, those made by cudaFreeAsync")                                       \
  X(ordered_frees,                                                                              \
    "of frees, cudaFree calls ordered behind the device's streams without a host stall (free "  \
    "mode ordered)")                                                                            \
  X(app_pool_allocs,                                                                            \
    "allocations from a pool the application made or made current, passed through")             \
  X(passthrough_allocs,                                                                         \
    "allocation calls passed to the real function (zero size, capture, app "                    \
    "pool, foreign context, shim not ready)")                                                   \
  X(passthrough_frees,                                                                          \
    "free calls passed to the real function (pointers the pool did not hand "                   \
    "out, capture)")                                                                            \
  X(failed_allocs, "allocation calls that returned an error to the application")                \
  X(ooms, "allocation calls that returned out-of-memory to the application")                    \
  X(oom_with_slack,                                                                             \
    "of ooms, those where the pool's unused memory was at least the request "                   \
    "(fragmentation)")                                                                          \
  X(oom_retries, "pool allocations that ran out of memory and were retried after a trim")       \
  X(oom_retry_successes, "of oom_retries, those that then succeeded")                           \
  X(fallback_allocs, "allocations the pool could not serve but the real function could")        \
  X(idle_trims, "background trims of an idle pool")                                             \
  X(idle_trimmed_bytes, "bytes given back by background trims")                                 \
  X(reset_dropped, "live allocations dropped by cudaDeviceReset")                               \
  X(cache_hits, "of allocs, those served from the user-space cache without a driver call")      \
  X(cache_misses, "allocations that found no fitting block in the cache (cache on)")            \
  X(cache_returns, "cached blocks given back to the pool (aged, evicted, out-of-memory, idle)") \
  X(fences, "device-wide fences started to make cached blocks reusable by any stream")

// X(name, meaning): figures with a current value, a peak and a running total of increases.
#define POOLSHIM_GAUGES(X)                                                          \
  X(requested_bytes, "bytes the application asked for, in live pooled allocations") \
  X(live_allocs, "live pooled allocations")                                         \
  X(cached_bytes, "bytes of freed blocks held in the user-space cache (not live)")

/// Buckets of the size histogram: bucket k counts live allocations of [2^k, 2^(k+1)) bytes.
constexpr int kHistogramBuckets = 48;

/// Index of the histogram bucket for `bytes` (> 0).
inline int histogram_bucket(std::uint64_t bytes) {
  const int k = 63 - __builtin_clzll(bytes | 1);
  return k < kHistogramBuckets ? k : kHistogramBuckets - 1;
}

struct Gauge {
  std::atomic<std::uint64_t> current{0};
  std::atomic<std::uint64_t> peak{0};
  std::atomic<std::uint64_t> total{0};

  void add(std::uint64_t n) {
    const std::uint64_t now = current.fetch_add(n, std::memory_order_relaxed) + n;
    total.fetch_add(n, std::memory_order_relaxed);
    std::uint64_t seen = peak.load(std::memory_order_relaxed);
    while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  void sub(std::uint64_t n) { current.fetch_sub(n, std::memory_order_relaxed); }
  void clear() {
    current.store(0, std::memory_order_relaxed);
    peak.store(0, std::memory_order_relaxed);
    total.store(0, std::memory_order_relaxed);
  }
};

struct GaugeValue {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
  std::uint64_t total = 0;
};

/// The live counters of one device. Aligned so that two devices never share a cache line.
struct alignas(64) DeviceStats {
#define POOLSHIM_COUNTER_FIELD(name, meaning) std::atomic<std::uint64_t> name{0};
  POOLSHIM_COUNTERS(POOLSHIM_COUNTER_FIELD)
#undef POOLSHIM_COUNTER_FIELD
#define POOLSHIM_GAUGE_FIELD(name, meaning) Gauge name;
  POOLSHIM_GAUGES(POOLSHIM_GAUGE_FIELD)
#undef POOLSHIM_GAUGE_FIELD
  std::array<std::atomic<std::uint64_t>, kHistogramBuckets> histogram{};

  void on_alloc(std::uint64_t bytes) {
    requested_bytes.add(bytes);
    live_allocs.add(1);
    allocs.fetch_add(1, std::memory_order_relaxed);
    histogram[histogram_bucket(bytes)].fetch_add(1, std::memory_order_relaxed);
  }
  void on_free(std::uint64_t bytes) {
    requested_bytes.sub(bytes);
    live_allocs.sub(1);
    frees.fetch_add(1, std::memory_order_relaxed);
    histogram[histogram_bucket(bytes)].fetch_sub(1, std::memory_order_relaxed);
  }
  void bump(std::atomic<std::uint64_t>& counter, std::uint64_t n = 1) {
    counter.fetch_add(n, std::memory_order_relaxed);
  }
};

/// A copy of DeviceStats taken by the background thread.
struct StatsSnapshot {
#define POOLSHIM_COUNTER_VALUE(name, meaning) std::uint64_t name = 0;
  POOLSHIM_COUNTERS(POOLSHIM_COUNTER_VALUE)
#undef POOLSHIM_COUNTER_VALUE
#define POOLSHIM_GAUGE_VALUE(name, meaning) GaugeValue name;
  POOLSHIM_GAUGES(POOLSHIM_GAUGE_VALUE)
#undef POOLSHIM_GAUGE_VALUE
  std::array<std::uint64_t, kHistogramBuckets> histogram{};
};

inline StatsSnapshot take_snapshot(const DeviceStats& s) {
  StatsSnapshot out;
#define POOLSHIM_COPY_COUNTER(name, meaning) out.name = s.name.load(std::memory_order_relaxed);
  POOLSHIM_COUNTERS(POOLSHIM_COPY_COUNTER)
#undef POOLSHIM_COPY_COUNTER
#define POOLSHIM_COPY_GAUGE(name, meaning)                           \
  out.name.current = s.name.current.load(std::memory_order_relaxed); \
  out.name.peak = s.name.peak.load(std::memory_order_relaxed);       \
  out.name.total = s.name.total.load(std::memory_order_relaxed);
  POOLSHIM_GAUGES(POOLSHIM_COPY_GAUGE)
#undef POOLSHIM_COPY_GAUGE
  for (int i = 0; i < kHistogramBuckets; ++i) {
    out.histogram[i] = s.histogram[i].load(std::memory_order_relaxed);
  }
  return out;
}

}  // namespace poolshim
