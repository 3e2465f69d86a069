// Per-device statistics (DESIGN §5). Each counter is listed once in the X-macros below; the
// atomic struct, the snapshot, the JSON fields and the README schema (checked by a test) come
// from them. Hooks update them with relaxed atomics: no lock, no allocation.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "atomic_max.h"

namespace poolshim {

// X(name, meaning): monotonic totals since start (or since the device was reset).
#define POOLSHIM_COUNTERS(X)                                                                      \
  X(allocs, "allocations served from the pool (cudaMalloc and cudaMallocAsync)")                  \
  X(frees, "pooled blocks given back (cudaFree and cudaFreeAsync)")                               \
  X(async_allocs, "of allocs, those made by cudaMallocAsync")                                     \
  X(async_frees, "of frees, those made by cudaFreeAsync")                                         \
  X(ordered_frees,                                                                                \
    "of frees, cudaFree calls ordered behind the device's streams without a host stall (free "    \
    "mode ordered)")                                                                              \
  X(app_pool_allocs,                                                                              \
    "allocations from a pool the application made or made current, passed through")               \
  X(passthrough_allocs,                                                                           \
    "allocation calls passed to the real function (zero size, capture, app "                      \
    "pool, foreign context, shim not ready)")                                                     \
  X(passthrough_frees,                                                                            \
    "free calls passed to the real function (pointers the pool did not hand "                     \
    "out, capture)")                                                                              \
  X(failed_allocs, "allocation calls that returned an error to the application")                  \
  X(ooms, "allocation calls that returned out-of-memory to the application")                      \
  X(oom_with_slack,                                                                               \
    "of ooms, those where the pool's unused memory was at least the request "                     \
    "(fragmentation)")                                                                            \
  X(oom_retries, "pool allocations that ran out of memory and were retried after a trim")         \
  X(oom_retry_successes, "of oom_retries, those that then succeeded")                             \
  X(fallback_allocs, "allocations the pool could not serve but the real function could")          \
  X(idle_trims, "background trims of an idle pool")                                               \
  X(idle_trimmed_bytes, "bytes given back by background trims")                                   \
  X(reset_dropped, "live allocations dropped by cudaDeviceReset")                                 \
  X(cache_hits, "of allocs, those served from a free block of the heap (no driver call)")         \
  X(cache_misses, "allocations that needed a new segment from the pool")                          \
  X(cache_returns, "times whole free segments went back to the pool (kept, idle, out-of-memory)") \
  X(fences, "device-wide fences started to make free blocks reusable by any stream")              \
  X(bounded_syncs,                                                                                \
    "synchronizations instead of growing, when free memory waiting for fences was worth it")      \
  X(retired_blocks, "blocks freed into a captured graph, which the heap never reuses")            \
  X(legacy_reuses,                                                                                \
    "barriers recorded on the legacy stream so that blocks freed in its order serve any stream")

// X(name, meaning): figures with a current value, a peak and a running total of increases.
#define POOLSHIM_GAUGES(X)                                                          \
  X(requested_bytes, "bytes the application asked for, in live pooled allocations") \
  X(live_allocs, "live pooled allocations")

/// The verdicts of an out-of-memory error (oom_verdict_of in events.h), each counted per device
/// beside `ooms` (the Prometheus file's poolshim_ooms_total; the log's oom records name them).
enum class OomVerdict { exhausted, cap, fragmentation };
constexpr int kOomVerdicts = 3;
constexpr const char* kOomVerdictNames[kOomVerdicts] = {"exhausted", "cap", "fragmentation"};

/// How far a shard's part of each gauge may run ahead of the shared sum (Gauge).
constexpr std::int64_t kRequestedBytesBatch = std::int64_t{16} << 20;
constexpr std::int64_t kLiveAllocsBatch = 16;

/// Buckets of the size histogram: bucket k counts live allocations of [2^k, 2^(k+1)) bytes.
constexpr int kHistogramBuckets = 48;

/// Index of the histogram bucket for `bytes` (> 0).
inline int histogram_bucket(std::uint64_t bytes) {
  const int k = 63 - __builtin_clzll(bytes | 1);
  return k < kHistogramBuckets ? k : kHistogramBuckets - 1;
}

/// Counter shards per device: each thread adds to one shard (its own cache lines), the
/// background thread sums them. Hooks on many threads then do not fight over one line.
constexpr int kCounterShards = 16;

/// The calling thread's shard, fixed at its first use (threads take shards in turn).
inline int counter_shard() {
  static std::atomic<int> next{0};
  static thread_local const int shard =
      next.fetch_add(1, std::memory_order_relaxed) % kCounterShards;
  return shard;
}

/// A total that many threads add to: one cache line per shard, summed when read.
class ShardedCounter {
 public:
  void add(std::uint64_t n = 1) {
    slots_[static_cast<std::size_t>(counter_shard())].value.fetch_add(n, std::memory_order_relaxed);
  }
  std::uint64_t load() const {
    std::uint64_t sum = 0;
    for (const Slot& s : slots_) sum += s.value.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  struct alignas(64) Slot {
    std::atomic<std::uint64_t> value{0};
  };
  std::array<Slot, kCounterShards> slots_{};
};

/// One shard's part of a Gauge: its net change, and how much of it the shared sum holds.
struct GaugePart {
  std::atomic<std::int64_t> value{0};
  std::atomic<std::int64_t> published{0};
};

/// A figure with a current value and a peak that many threads change (DESIGN §5). A change goes
/// to the calling thread's part (its counter shard: its own cache line); a part adds what it
/// holds unpublished to the shared sum once that reaches +-batch, so that threads seldom write
/// the one shared line. The current value is the parts' sum, exact when read. The peak is
/// raised from the shared sum plus the changing part's unpublished change: exact while one
/// shard changes the figure, otherwise within (shards - 1) x batch of the truth (the other
/// parts' unpublished changes); each snapshot also raises it to the exact current value.
struct Gauge {
  explicit Gauge(std::int64_t batch_) : batch(batch_) {}

  void add(GaugePart& part, std::int64_t n) {
    const std::int64_t v = part.value.fetch_add(n, std::memory_order_relaxed) + n;
    std::int64_t p = part.published.load(std::memory_order_relaxed);
    if (v - p >= batch || p - v >= batch) {
      // A thread sharing the shard may publish first: then `p` is what it published.
      if (part.published.compare_exchange_strong(p, v, std::memory_order_relaxed)) {
        sum.fetch_add(v - p, std::memory_order_relaxed);
        p = v;
      }
    }
    if (n <= 0) return;
    const std::int64_t estimate = sum.load(std::memory_order_relaxed) + (v - p);
    if (estimate > 0) raise_to(peak, static_cast<std::uint64_t>(estimate));
  }

  const std::int64_t batch;
  // Lines of their own: every allocation reads both, and a publish or a new peak writes one.
  alignas(64) std::atomic<std::int64_t> sum{0};  // the parts' published changes
  alignas(64) mutable std::atomic<std::uint64_t> peak{0};
};

struct GaugeValue {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
  std::uint64_t total = 0;
};

/// One shard of a device's counters (the X-macro counters, the gauges' totals, the
/// histogram). Histogram buckets go up and down on different shards: only their sum means
/// anything (unsigned wrap-around makes it exact).
struct alignas(64) CounterShard {
#define POOLSHIM_COUNTER_FIELD(name, meaning) std::atomic<std::uint64_t> name{0};
  POOLSHIM_COUNTERS(POOLSHIM_COUNTER_FIELD)
#undef POOLSHIM_COUNTER_FIELD
#define POOLSHIM_GAUGE_TOTAL(name, meaning)   \
  std::atomic<std::uint64_t> name##_total{0}; \
  GaugePart name##_part;
  POOLSHIM_GAUGES(POOLSHIM_GAUGE_TOTAL)
#undef POOLSHIM_GAUGE_TOTAL
  std::array<std::atomic<std::uint64_t>, kHistogramBuckets> histogram{};
  std::array<std::atomic<std::uint64_t>, kOomVerdicts> ooms_by_verdict{};
};

using Counter = std::atomic<std::uint64_t> CounterShard::*;

/// The live counters of one device.
struct DeviceStats {
  alignas(64) Gauge requested_bytes{kRequestedBytesBatch};
  alignas(64) Gauge live_allocs{kLiveAllocsBatch};
  std::array<CounterShard, kCounterShards> shards{};

  /// The exact current value of a gauge: its parts added up (0 if a free's shard was read
  /// before its allocation's).
  std::uint64_t current(GaugePart CounterShard::*part) const {
    std::int64_t n = 0;
    for (const CounterShard& c : shards) n += (c.*part).value.load(std::memory_order_relaxed);
    return n > 0 ? static_cast<std::uint64_t>(n) : 0;
  }

  CounterShard& mine() { return shards[static_cast<std::size_t>(counter_shard())]; }
  void on_alloc(std::uint64_t bytes) {
    CounterShard& c = mine();
    requested_bytes.add(c.requested_bytes_part, static_cast<std::int64_t>(bytes));
    live_allocs.add(c.live_allocs_part, 1);
    c.requested_bytes_total.fetch_add(bytes, std::memory_order_relaxed);
    c.live_allocs_total.fetch_add(1, std::memory_order_relaxed);
    c.allocs.fetch_add(1, std::memory_order_relaxed);
    c.histogram[histogram_bucket(bytes)].fetch_add(1, std::memory_order_relaxed);
  }
  void on_free(std::uint64_t bytes) { on_gone(bytes, &CounterShard::frees); }
  /// A live allocation that disappeared without a free (cudaDeviceReset).
  void on_dropped(std::uint64_t bytes) { on_gone(bytes, &CounterShard::reset_dropped); }
  /// A live allocation of `bytes` is no longer live; `why` counts how.
  void on_gone(std::uint64_t bytes, Counter why) {
    CounterShard& c = mine();
    requested_bytes.add(c.requested_bytes_part, -static_cast<std::int64_t>(bytes));
    live_allocs.add(c.live_allocs_part, -1);
    (c.*why).fetch_add(1, std::memory_order_relaxed);
    c.histogram[histogram_bucket(bytes)].fetch_sub(1, std::memory_order_relaxed);
  }
  void bump(Counter counter, std::uint64_t n = 1) {
    (mine().*counter).fetch_add(n, std::memory_order_relaxed);
  }
  /// An out-of-memory error returned to the application: `ooms` and its verdict's count.
  void on_oom(OomVerdict verdict) {
    CounterShard& c = mine();
    c.ooms.fetch_add(1, std::memory_order_relaxed);
    c.ooms_by_verdict[static_cast<std::size_t>(verdict)].fetch_add(1, std::memory_order_relaxed);
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
  std::array<std::uint64_t, kOomVerdicts> ooms_by_verdict{};  // sums to `ooms`
};

inline StatsSnapshot take_snapshot(const DeviceStats& s) {
  StatsSnapshot out;
  for (const CounterShard& c : s.shards) {
#define POOLSHIM_SUM_COUNTER(name, meaning) out.name += c.name.load(std::memory_order_relaxed);
    POOLSHIM_COUNTERS(POOLSHIM_SUM_COUNTER)
#undef POOLSHIM_SUM_COUNTER
#define POOLSHIM_SUM_TOTAL(name, meaning) \
  out.name.total += c.name##_total.load(std::memory_order_relaxed);
    POOLSHIM_GAUGES(POOLSHIM_SUM_TOTAL)
#undef POOLSHIM_SUM_TOTAL
    for (int i = 0; i < kHistogramBuckets; ++i) {
      out.histogram[i] += c.histogram[i].load(std::memory_order_relaxed);
    }
    for (int i = 0; i < kOomVerdicts; ++i) {
      out.ooms_by_verdict[i] += c.ooms_by_verdict[i].load(std::memory_order_relaxed);
    }
  }
  // Shards are read one after another: an allocation counted on a shard already read and its
  // free on one read later leave a sum one below the truth, which wraps; clamp it at 0.
  for (auto& bucket : out.histogram) {
    if (static_cast<std::int64_t>(bucket) < 0) bucket = 0;
  }
#define POOLSHIM_COPY_GAUGE(name, meaning)                  \
  out.name.current = s.current(&CounterShard::name##_part); \
  raise_to(s.name.peak, out.name.current);                  \
  out.name.peak = s.name.peak.load(std::memory_order_relaxed);
  POOLSHIM_GAUGES(POOLSHIM_COPY_GAUGE)
#undef POOLSHIM_COPY_GAUGE
  return out;
}

}  // namespace poolshim
