// Router: the allocator core's entry points (DESIGN §3). A hook calls one of these with the
// real function as a fallback; the Router serves the call from the device's pool or declines
// it by calling the fallback, and keeps the allocation table and the counters right either
// way. Errors the application sees always come from the real function, so they are native
// (codes, sticky "last error"), and an internal failure the pool recovered from leaves none.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "allocation_table.h"
#include "call_sites.h"
#include "config.h"
#include "cuda_api.h"
#include "device_pool.h"
#include "events.h"
#include "function_ref.h"
#include "peer_access.h"
#include "stats.h"
#include "stream_registry.h"

namespace poolshim {

constexpr int kMaxDevices = 64;

/// How the real function fared, as far as the counters care.
enum class RealResult { success, out_of_memory, error };
/// The real free function behind a hook.
using Fallback = FunctionRef<RealResult()>;
/// The real allocation function behind a hook, asked for `bytes`: the request, or
/// kRefusedRequest when the pool's cap refuses it (the real function then fails with the
/// native out-of-memory error and its native side effects, without allocating anything).
using AllocFallback = FunctionRef<RealResult(std::size_t bytes)>;
/// A request no device can serve (1 PiB: on an H200 cudaMalloc answers it with
/// cudaErrorMemoryAllocation at once).
constexpr std::size_t kRefusedRequest = std::size_t{1} << 50;

/// One device's figures at a moment: the sample record.
struct DeviceSnapshot {
  int device = -1;
  StatsSnapshot stats;
  PoolUsage pool;
  std::uint64_t cached_bytes = 0;       // in the user-space cache (used to the pool)
  std::uint64_t cached_bytes_peak = 0;  // the most the cache held since the pool was made
  bool device_info_valid = false;
  std::uint64_t device_free = 0;
  std::uint64_t device_total = 0;
  std::uint64_t cap = 0;  // the pool's cap, 0 when none
};

struct DeviceDescription {
  int ordinal = -1;
  std::string name;
  std::uint64_t total = 0;
};

struct LiveAllocation {
  std::uintptr_t ptr = 0;
  Allocation info;
};

class Router {
 public:
  Router(const DriverApi& driver, const Config& config, EventQueue& events);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // ---- called by hooks ----------------------------------------------------------------
  /// cudaMalloc: `bytes` (> 0) on `device`, usable from any stream once this returns. True
  /// when the pool served it (*out set); false when `real` was called instead.
  bool allocate_sync(int device, std::size_t bytes, CUdeviceptr* out, AllocFallback real);
  /// cudaMallocAsync: `bytes` (> 0) from `device`'s pool in `stream`'s order; as above.
  bool allocate_async(int device, std::size_t bytes, CUstream stream, CUdeviceptr* out,
                      AllocFallback real);
  /// cudaFree of a non-null pointer: synchronize, then return the block to its pool.
  /// `caller_device` (the runtime's current device) is where a foreign pointer is counted.
  void free_sync(void* ptr, int caller_device, Fallback real);
  /// cudaFreeAsync: return the block in `stream`'s order.
  void free_async(void* ptr, CUstream stream, Fallback real);
  /// The device of the thread's current context, -1 when none is current (driver calls only:
  /// unlike cudaGetDevice it cannot touch the runtime's error state).
  int current_device() const;
  /// The device a named stream belongs to; -1 when the stream is not valid.
  int stream_device(CUstream stream) const;
  /// A free that must not be routed now (a stream capture is in progress): calls `real` and,
  /// when it freed a pooled pointer, forgets it.
  void free_unrouted(void* ptr, int caller_device, Fallback real);
  /// An allocation call passed straight to the real function.
  void note_passthrough_alloc(int device);
  /// An allocation from the application's own pool (cuMemAllocFromPoolAsync), passed through.
  void note_app_pool_alloc(int device);
  /// The streams `ordered` frees wait for (owned by the shim, which sees streams being made
  /// before the core starts). Without one, every free is a `sync` free.
  void set_stream_registry(StreamRegistry* registry) { registry_ = registry; }
  /// The peer-access pairs the application enabled (owned by the shim, like the registry).
  void set_peer_access(const PeerAccess* peers) { peers_ = peers; }
  /// Device `from` may now reach `to`'s memory: open `to`'s pool to it (if it exists yet;
  /// a pool made later is opened when it is made).
  void open_pool_to(int to, int from);
  /// Whether an application's stream capture is in progress anywhere: the background thread
  /// then records nothing on the application's streams (a record would join the capture).
  void set_capture_probe(bool (*captures_active)()) { captures_active_ = captures_active; }
  /// A stream is about to be destroyed (any stream, registered or not): cached blocks freed in
  /// its order lose that shortcut, so that a new stream with the same handle cannot take them.
  void before_any_stream_destroy(CUstream stream);
  /// Code of the shim itself, left out of recorded call sites (the hooks' frames).
  void set_own_code_range(std::uintptr_t begin, std::uintptr_t end) {
    own_code_begin_ = begin;
    own_code_end_ = end;
  }
  const CallSiteTable& call_sites() const { return sites_; }
  /// The pool's cap of `device` in bytes, 0 when none (or no pool yet).
  std::uint64_t cap(int device) const;
  /// A legacy IPC export failed: if `ptr` is pooled, say why (once).
  void note_ipc_failure(const void* ptr);
  /// Before a registered non-blocking stream is destroyed, while it is still listed (see
  /// StreamRegistry::remove): blocks freed or fenced later must still wait for the work it
  /// holds, so the free stream waits for it now.
  void wait_for_stream_at_destroy(const StreamRegistry::Entry& entry);
  /// After the stream left the list: its event goes.
  void release_stream_event(const StreamRegistry::Entry& entry);
  /// A non-blocking stream was listed. If a cudaMalloc was ever served behind a legacy barrier
  /// (legacy_reuse), the stream first waits for the last barrier, which orders it behind every
  /// such block's earlier users. No host stall, nothing recorded.
  void after_stream_listed(const StreamRegistry::Entry& entry);
  /// Memory the device's pool holds but has not handed out.
  std::uint64_t unused_bytes(int device) const;
  /// cudaMemGetInfo as the application must see it: the pool's unused memory counts as free,
  /// and under a cap the cap is the total and its headroom the most that is free.
  void adjust_memory_info(int device, std::size_t* free, std::size_t* total) const;
  /// Before cudaDeviceReset(device): the pool and every table entry of the device go away.
  void before_device_reset(int device);
  /// The application made its own pool current on `device` (cudaDeviceSetMemPool): its
  /// cudaMallocAsync calls then go to that pool untouched.
  void set_app_pool(int device, bool app_owned);
  bool app_pool(int device) const;
  /// Hooks wait this long for an OOM record to reach the log (0 when no log is written).
  void set_oom_record_wait(std::chrono::milliseconds wait) {
    oom_record_wait_ms_.store(wait.count(), std::memory_order_relaxed);
  }

  // ---- called by the background thread -------------------------------------------------
  /// Devices whose pool exists.
  std::vector<int> active_devices() const;
  DeviceSnapshot snapshot(int device) const;
  /// Releases unused memory of `device`'s pool until it holds fewer than `keep_reserved`
  /// bytes; counts it as an idle trim. Returns the bytes given back.
  std::uint64_t trim_idle(int device, std::uint64_t keep_reserved);
  /// Moves the cache on: polls or starts the device's event fence (unless a capture is in
  /// progress) and gives back blocks not reused for `max_age_ns` (0: none). Returns the bytes
  /// given back.
  std::uint64_t tend_cache(int device, std::uint64_t now_ns, std::uint64_t max_age_ns);
  std::vector<LiveAllocation> live_allocations() const;
  std::vector<DeviceDescription> describe_devices() const;
  const DriverApi& driver() const { return driver_; }
  const Config& config() const { return config_; }
  /// Totals over devices of a counter, e.g. total(&StatsSnapshot::allocs).
  std::uint64_t pooled_allocations() const;

 private:
  enum class PoolState : std::uint8_t { none, ready, failed };

  /// The pool of `device`, created on first use; nullptr when it cannot exist (one warning).
  DevicePool* pool_for(int device);
  DevicePool* existing_pool(int device) const;
  /// Makes `pool`'s primary context current when the thread has no context. False when
  /// another context is current: the call is then passed through.
  bool adopt_context(const DevicePool& pool);
  /// Synchronizes `pool`'s context and the caller's current context (cudaFree semantics).
  CUresult synchronize_for_free(const DevicePool& pool) const;
  /// Opens `pool` to device `from` (cuMemPoolSetAccess), one warning on failure.
  void set_pool_access(DevicePool& pool, int from);
  /// Why the order of `pool`'s device's streams cannot prove a free safe (DESIGN §3), or
  /// nullptr when it can: then an event behind every stream covers all work before it.
  const char* unordered_reason(const DevicePool& pool) const;
  /// Whether an `ordered` free of `pool`'s block can be proven safe (one warning when not).
  bool ordered_free_possible(const DevicePool& pool) const;
  /// Makes the pool's free stream wait for the legacy default stream and every registered
  /// non-blocking stream of the device. No host stall.
  CUresult order_free_stream(DevicePool& pool);
  /// Enqueues the free on the pool's free stream behind every stream (order_free_stream).
  CUresult free_ordered(DevicePool& pool, CUdeviceptr ptr);

  // ---- the user-space cache (BlockCache) ----
  /// The stream a block freed on `stream` may serve at once: the legacy stream, or a named
  /// stream whose destruction the shim sees; nullptr (fences only) for the per-thread stream.
  CUstream cache_affinity(CUstream stream) const;
  /// A cached block for `bytes` usable on `stream` (nullptr: on every stream, cudaMalloc);
  /// failing that, one usable on `fallback` (when non-null).
  bool take_cached(DevicePool& pool, std::size_t bytes, CUstream stream, CachedBlock* out,
                   CUstream fallback = nullptr);
  /// legacy_reuse, cudaMalloc's side: whether a block cudaFree'd behind a legacy barrier may
  /// serve it (no non-blocking stream on the device, order provable). Marks the pool first, so
  /// that a non-blocking stream listed meanwhile waits (after_stream_listed).
  bool legacy_barrier_allowed(DevicePool& pool);
  /// The barrier: an event recorded on the legacy default stream after the block's free, which
  /// every blocking stream's later work waits for. False when it could not be recorded.
  bool legacy_barrier(DevicePool& pool);
  /// A block just taken from the cache: when it waits behind a legacy barrier (legacy_reuse) and
  /// its fence has not completed, orders its new users behind its old ones (the barrier, or a
  /// synchronization). `any_stream`: a cudaMalloc's block; otherwise one for the legacy stream.
  void order_behind_legacy_barrier(DevicePool& pool, const CachedBlock& b, bool any_stream);
  /// legacy_reuse, cudaFree's side (mode ordered): whether a block freed now may be cached with
  /// the legacy stream's shortcut.
  bool legacy_affinity_for_free(DevicePool& pool) const;
  /// Keeps a freed block; false when the cache will not (the caller frees it).
  bool cache_block(DevicePool& pool, const Allocation& a, CUdeviceptr ptr, CUstream stream,
                   std::uint64_t ready_at);
  /// A cache miss: allocate_with_retry, and when the pool had to reserve more while the cache
  /// held blocks, ready blocks worth what it grew by go back to it (freed on `stream`).
  CUresult allocate_from_pool(DevicePool& pool, std::size_t bytes, CUstream stream,
                              CUdeviceptr* out);
  void give_back_for_growth(DevicePool& pool, std::uint64_t grown, CUstream stream);
  /// Gives a ready cached block back to the pool, freed on `stream` (nullptr: the pool's own).
  void return_block(DevicePool& pool, const CachedBlock& b, CUstream stream = nullptr);
  /// Gives every cached block whose fence has completed back to the pool; their frees are
  /// complete when this returns (for a trim that follows). Returns the bytes.
  std::uint64_t return_ready_blocks(DevicePool& pool);
  /// A free of a pointer the table does not hold: when it is a cached block (a double free),
  /// the block leaves the cache and goes back to the pool in order, so that the real function
  /// then answers as natively (the pointer is no longer allocated) and the block is never
  /// handed out twice.
  void release_if_cached(std::uintptr_t ptr);
  /// Polls the event fence in flight and (`may_start`) starts one when blocks wait for it. True
  /// when the completed fence moved. Never blocks: another thread at it means false.
  bool advance_fences(DevicePool& pool, bool may_start = true);
  /// A synchronization of the device that is a fence: returns its result.
  CUresult synchronize_as_fence(DevicePool& pool);
  /// One allocation attempt, with the trim-and-retry of DESIGN §3 on out-of-memory.
  CUresult allocate_with_retry(DevicePool& pool, std::size_t bytes, CUstream stream,
                               CUdeviceptr* out);
  void decline_allocation(DevicePool& pool, std::size_t bytes, CUstream stream, bool async,
                          CUresult pool_result, AllocFallback real);
  /// The real free of a pooled pointer after the pool path failed: forget the pointer if the
  /// real function freed it, keep it otherwise.
  void finish_failed_free(std::uintptr_t ptr, const Allocation& a, Fallback real);
  /// The device's free and total memory as the driver sees it (cuMemGetInfo in its context).
  bool device_memory(const DevicePool& pool, std::uint64_t* free, std::uint64_t* total) const;
  OomReport describe_oom(DevicePool& pool, std::size_t bytes, CUstream stream, bool async) const;
  void warn_once(std::atomic<bool>& flag, std::string text);
  DeviceStats& stats(int device) { return stats_[static_cast<std::size_t>(device)]; }
  static bool valid_device(int device) { return device >= 0 && device < kMaxDevices; }

  const DriverApi& driver_;
  const Config& config_;
  EventQueue& events_;
  PoolSettings settings_;
  StreamRegistry* registry_ = nullptr;
  const PeerAccess* peers_ = nullptr;
  CallSiteTable sites_;
  std::uintptr_t own_code_begin_ = 0;
  std::uintptr_t own_code_end_ = 0;
  /// The caller's call site (POOLSHIM_BACKTRACE frames), 0 when not recorded.
  std::uint32_t capture_site();
  bool ordered_mode_ = false;
  bool (*captures_active_)() = nullptr;
  int device_count_ = 0;
  std::atomic<long long> oom_record_wait_ms_{0};
  std::atomic<std::uint64_t> stream_epoch_{0};  // streams destroyed or reset (stream_device)

  std::array<std::atomic<DevicePool*>, kMaxDevices> pools_{};
  std::array<std::atomic<PoolState>, kMaxDevices> pool_state_{};
  std::array<std::atomic<bool>, kMaxDevices> app_pool_{};
  std::array<std::atomic<bool>, kMaxDevices> ever_used_{};
  std::array<DeviceStats, kMaxDevices> stats_{};
  AllocationTable table_;

  mutable std::mutex create_mutex_;  // pool creation and reset only: never on the hot path
  std::vector<std::unique_ptr<DevicePool>> pools_owned_;  // includes retired ones (see reset)

  std::atomic<bool> warned_foreign_context_{false};
  std::atomic<bool> warned_pool_failure_{false};
  std::atomic<bool> warned_bad_device_{false};
  std::atomic<bool> warned_fallback_{false};
  mutable std::atomic<bool> warned_ordered_fallback_{false};
  std::atomic<bool> warned_ipc_{false};
  std::atomic<bool> warned_peer_{false};
};

}  // namespace poolshim
