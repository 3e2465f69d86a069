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
#include "event_log.h"
#include "events.h"
#include "function_ref.h"
#include "ipc_share.h"
#include "native_ledger.h"
#include "nvtx_marks.h"
#include "peer_access.h"
#include "stats.h"
#include "stream_registry.h"
#include "vmm_ledger.h"

namespace poolshim {

constexpr int kMaxDevices = 64;
/// The stream token of the legacy default stream (the value of CU_STREAM_LEGACY; a token is
/// compared, never given to the driver).
constexpr std::uintptr_t kLegacyToken = 0x1;
using HeapBlock = DeviceHeap::Block;

/// How the real function fared, as far as the counters care.
enum class RealResult { success, out_of_memory, error };
/// The real free function behind a hook, called for `ptr`: the application's pointer when the
/// pool did not hand it out; for a block of the heap, the device's proxy (DevicePool::proxy), a
/// real allocation of the shim's own, so that the real function answers natively (capture
/// rules, sticky errors) without ever freeing a segment under the heap's live blocks.
using Fallback = FunctionRef<RealResult(void* ptr)>;
/// The real allocation function behind a hook, asked for `bytes`: the request, or
/// kRefusedRequest when a cap refuses it (the real function then fails with the native
/// out-of-memory error and its native side effects, without allocating anything). It stores
/// the address it got in `*native` (0 when it failed), so that the allocation can be tracked.
using AllocFallback = FunctionRef<RealResult(std::size_t bytes, CUdeviceptr* native)>;
/// A request no device can serve (1 PiB: on an H200 cudaMalloc answers it with
/// cudaErrorMemoryAllocation at once).
constexpr std::size_t kRefusedRequest = std::size_t{1} << 50;

/// One device's figures at a moment: the sample record.
struct DeviceSnapshot {
  int device = -1;
  StatsSnapshot stats;
  PoolUsage pool;
  std::uint64_t cached_bytes = 0;       // in the heap's free blocks (used to the pool)
  std::uint64_t cached_bytes_peak = 0;  // the most they held since the pool was made
  bool device_info_valid = false;
  std::uint64_t device_free = 0;
  std::uint64_t device_total = 0;
  std::uint64_t cap = 0;  // the pool's cap, 0 when none
  // Live allocations the real function served that the shim tracks (every allocation in
  // observe mode; pass-through ones in pool mode): bytes, their peak, count.
  std::uint64_t native_bytes = 0;
  std::uint64_t native_bytes_peak = 0;
  std::uint64_t native_allocs = 0;
  bool observe = false;   // POOLSHIM_MODE=observe
  VmmDeviceSnapshot vmm;  // the application's own VMM memory (vmm_ledger.h)
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
  /// A free that must not be routed now (a stream capture is in progress): the real function
  /// answers (for a pooled pointer, on the proxy); when it freed, the pooled block is given back
  /// to the heap behind the next fence, or (`stream` capturing: a graph holds the free) kept
  /// out of use for good. `async`: a cudaFreeAsync on `stream`.
  void free_unrouted(void* ptr, int caller_device, Fallback real, bool async = false,
                     CUstream stream = nullptr);
  /// A stream capture is about to begin: every pool gets its proxy (DevicePool::proxy) now,
  /// while the allocation cannot join a capture.
  void before_capture();
  /// A capture about to begin is counted (the capture probe reads it): waits for any fence
  /// being started (its records on the application's streams), so that none lands in the
  /// capture; later fence starts see the count and start nothing.
  void capture_counted();
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
  /// A stream is about to be destroyed (any stream, registered or not): free blocks freed in
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
  /// cuMemCreate made `bytes` of physical memory for the application (`prop` says where): its
  /// books, with the call site (device memory only; the device is then in use).
  void note_vmm_create(std::uint64_t handle, std::size_t bytes, const CUmemAllocationProp* prop);
  /// The books of the application's own VMM memory (release, map, unmap go straight there).
  VmmLedger& vmm() { return vmm_; }
  const VmmLedger& vmm() const { return vmm_; }
  /// A legacy IPC export failed: if `ptr` is pooled, say why (once).
  void note_ipc_failure(const void* ptr);
  /// Legacy IPC of pooled memory (ipc_share.h). Writes the 64-byte handle of the pooled block
  /// at `ptr` and returns true; false when `ptr` is no block of a paged arena with exportable
  /// pages or the broker cannot start (the real function answers then, natively).
  bool ipc_export(CUdeviceptr ptr, void* handle);
  /// Opens a handle of ours (IpcShare::ours) in the current context.
  CUresult ipc_open(const void* handle, CUdeviceptr* out);
  /// Closes an address ipc_open gave (true, with `result`); false for any other address.
  bool ipc_close(CUdeviceptr ptr, CUresult* result);
  /// In a forked child: closes the parent's IPC socket (IpcShare::forget_in_child).
  void ipc_forget_in_child();
  /// At exit: stops the IPC broker, removing its socket (IpcShare::stop).
  void ipc_stop();
  const IpcShare& ipc() const { return *ipc_; }
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
  /// The application made a stream (or uses the per-thread default stream): the legacy rule's
  /// "only the legacy stream" case ends, with one barrier behind the blocks it handed out.
  void after_stream_created();
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
  /// POOLSHIM_EVENTS: every allocation, free and failed allocation from now on is recorded in
  /// `log` (which must outlive the router); nullptr stops recording (the file could not be
  /// opened or written). Records only cost a hook anything while a log is set.
  void set_event_log(EventLog* log) { event_log_.store(log, std::memory_order_release); }
  const EventLog* event_log() const { return event_log_.load(std::memory_order_acquire); }
  /// Hooks wait this long for an OOM record to reach the log (0 when no log is written).
  void set_oom_record_wait(std::chrono::milliseconds wait) {
    oom_record_wait_ms_.store(wait.count(), std::memory_order_relaxed);
  }

  // ---- called by the background thread -------------------------------------------------
  /// Devices whose pool exists.
  std::vector<int> active_devices() const;
  DeviceSnapshot snapshot(int device) const;
  /// Releases unused memory of `device`'s pool until it holds fewer than `keep_reserved`
  /// bytes; counts it as an idle trim. Returns the bytes given back: the heap's (free segments
  /// to the pool, free pages to the driver) and the pool's.
  std::uint64_t trim_idle(int device, std::uint64_t keep_reserved);
  /// Moves the heap on at time `now` (monotonic ns): turns its arenas' activity period
  /// (arena_activity.h), polls the device's event fence in flight and gives whole free segments
  /// beyond the `cache` option back to the pool. Returns the bytes given back.
  std::uint64_t tend_heap(int device, std::uint64_t now);
  std::vector<LiveAllocation> live_allocations() const;
  std::vector<DeviceDescription> describe_devices() const;
  const DriverApi& driver() const { return driver_; }
  /// What chose the free mode in use (`free=auto`: see pool/free_mode.h), for the start record.
  const std::string& free_mode_why() const { return free_mode_why_; }
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

  /// Whether the device may be served without a driver call: true unless a synchronization or
  /// query failed before and a query of the idle private stream still fails (DevicePool::faulted).
  bool healthy(DevicePool& pool);

  // ---- the heap (SegmentAllocator) and its reuse rules (DESIGN §7) ----
  /// The stream token a block freed on `stream` carries, and the one an allocation on it asks
  /// for: the legacy stream's, a named stream's whose destruction the shim sees, or 0 (fences
  /// only: the per-thread stream, streams the shim did not see made).
  std::uintptr_t stream_token(CUstream stream) const;
  /// A block of `bytes` for `token` (0: cudaMalloc without the legacy rule): a free block usable
  /// now, or after a fence that completed meanwhile, or after one synchronization when what
  /// waits for fences is worth it (bounded memory), else from a new segment, with the
  /// out-of-memory retry of DESIGN §3. CUDA_SUCCESS, or the pool's error.
  CUresult take_block(DevicePool& pool, std::size_t bytes, std::uintptr_t token, HeapBlock* out);
  /// Takes back the block of `a` for `token`, usable by every stream after fence `ready_at`.
  /// `stream`: the free's stream, for the event log (0 for cudaFree).
  void give_block(DevicePool& pool, std::uintptr_t ptr, const Allocation& a, std::uintptr_t token,
                  std::uint64_t ready_at, std::uintptr_t stream);
  /// The legacy rule, cudaMalloc's side: whether a block freed in the legacy stream's order may
  /// serve it (legacy_reuse on, no non-blocking stream on the device, order provable). Marks
  /// the pool first, so that a non-blocking stream listed meanwhile waits (after_stream_listed).
  bool legacy_reuse_allowed(DevicePool& pool);
  /// The barrier: an event recorded on the legacy default stream after every legacy-token free
  /// so far (none when the last one covers them). False when it could not be recorded.
  bool legacy_barrier(DevicePool& pool);
  /// A block just served by the legacy token before its fence completed: orders its new users
  /// behind its old ones (nothing while only the legacy stream is in use or the last barrier
  /// covers it; else the barrier, or a synchronization). `any_stream`: a cudaMalloc's block.
  /// False when a capture is in progress, which a record or a synchronization would join or
  /// break: the block must not be handed out.
  bool order_legacy_handout(DevicePool& pool, bool any_stream);
  /// The block `b` that order_legacy_handout refused goes back to the heap as it was, and the
  /// real function answers the request (as every allocation during a capture).
  void refuse_legacy_handout(DevicePool& pool, const HeapBlock& b, std::size_t bytes,
                             AllocFallback real);
  /// The legacy rule, cudaFree's side (mode ordered): whether a block freed now takes the
  /// legacy stream's token.
  bool legacy_token_for_free(DevicePool& pool) const;
  /// Polls the event fence in flight and (`may_start`) starts one when blocks wait for it. True
  /// when the completed fence moved. Never blocks: another thread at it means false.
  bool advance_fences(DevicePool& pool, bool may_start = true);
  /// A synchronization of the device that is a fence: returns its result. `why` names its NVTX
  /// range (nvtx_marks.h).
  CUresult synchronize_as_fence(DevicePool& pool, nvtx_marks::Wait why);
  /// The heap's whole free segments and free pages beyond `keep` go back (DeviceHeap::trim):
  /// counted as a cache return and marked when it gives back any. Returns the bytes.
  std::uint64_t return_cache(DevicePool& pool, std::uint64_t keep);
  void decline_allocation(DevicePool& pool, std::size_t bytes, CUstream stream, bool async,
                          CUresult pool_result, AllocFallback real);
  /// The real free for a pooled pointer, on the device's proxy: when it succeeds, the block goes
  /// back to the heap behind the next fence (`retire`: it stays out of use for good) and a new
  /// proxy is made; otherwise the pointer stays live. Returns what the real function did.
  RealResult free_on_proxy(std::uintptr_t ptr, const Allocation& a, Fallback real,
                           bool retire = false, std::uintptr_t stream = 0);
  /// The pointer the real free function may be given for `ptr`, which the pool does not hold:
  /// `ptr`, or an address inside it when it is the base of one of the heap's segments (a second
  /// free of a segment's first block).
  void* for_real_free(void* ptr) const;
  /// The device's free and total memory as the driver sees it (cuMemGetInfo in its context).
  bool device_memory(const DevicePool& pool, std::uint64_t* free, std::uint64_t* total) const;
  bool device_memory(CUcontext context, std::uint64_t* free, std::uint64_t* total) const;
  /// What every OOM report holds: the request and the device's live figures.
  OomReport oom_report(int device, std::size_t bytes, CUstream stream, bool async) const;
  OomReport describe_oom(DevicePool& pool, std::size_t bytes, CUstream stream, bool async) const;
  /// The `limit` option of `device`: POOLSHIM_LIMIT_<device> over POOLSHIM_LIMIT.
  SizeValue limit_option(int device) const;
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
  /// Whether the capture probe reports a capture in progress (none without a probe).
  bool capture_in_progress() const { return captures_active_ != nullptr && captures_active_(); }
  bool ordered_mode_ = false;
  std::string free_mode_why_;
  bool (*captures_active_)() = nullptr;
  int device_count_ = 0;
  std::atomic<long long> oom_record_wait_ms_{0};
  std::atomic<EventLog*> event_log_{nullptr};
  std::atomic<std::uint64_t> stream_epoch_{0};  // streams destroyed or reset (stream_device)

  std::array<std::atomic<DevicePool*>, kMaxDevices> pools_{};
  std::array<std::atomic<PoolState>, kMaxDevices> pool_state_{};
  std::array<std::atomic<bool>, kMaxDevices> app_pool_{};
  std::array<std::atomic<bool>, kMaxDevices> ever_used_{};
  std::array<DeviceStats, kMaxDevices> stats_{};
  AllocationTable table_;

  mutable std::mutex create_mutex_;  // pool creation and reset only: never on the hot path
  std::vector<std::unique_ptr<DevicePool>> pools_owned_;  // includes retired ones (see reset)
  std::unique_ptr<IpcShare> ipc_;  // after the pools: its exports point into their page maps

  /// table_.take, forgetting the block's IPC export when it has one.
  std::optional<Allocation> take_live(std::uintptr_t key);

  // ---- allocations the real function served, tracked (observe mode, pass-through) ----
  bool observe_ = false;  // POOLSHIM_MODE=observe: nothing is pooled
  NativeLedger natives_;
  VmmLedger vmm_;
  /// Observe mode's allocation: the real function serves it (past the cap it fails natively,
  /// asked for kRefusedRequest) and it is tracked as a pooled one is. Returns false: the
  /// application's pointer is the real function's.
  bool observe_allocation(int device, std::size_t bytes, CUstream stream, bool async,
                          AllocFallback real);
  /// The real function asked for `bytes` on `device` in pool mode (no pool, or the pool
  /// declined): what it serves is tracked in natives_, never in the pooled figures.
  /// `asked`: the application's request when `bytes` is kRefusedRequest (the event log's row).
  RealResult pass_through(int device, std::size_t bytes, CUstream stream, bool async,
                          AllocFallback real, std::size_t asked = 0);
  /// The table entry of a native allocation at `ptr` that natives_ admitted.
  void track_native(CUdeviceptr ptr, int device, std::size_t bytes, CUstream stream, bool async);
  /// One row of the event log, when it is on (a single load and branch when it is off).
  void note_event(EventAction action, std::uintptr_t ptr, std::uint64_t bytes,
                  std::uintptr_t stream, int device, std::uint32_t site) {
    EventLog* log = event_log_.load(std::memory_order_acquire);
    if (__builtin_expect(log != nullptr, 0)) log->record(action, ptr, bytes, stream, device, site);
  }
  /// A row for an allocation that failed (its call site, when call sites are recorded).
  void note_failure(int device, std::size_t bytes, CUstream stream) {
    if (event_log_.load(std::memory_order_relaxed) == nullptr) return;
    note_event(EventAction::allocate_failure, 0, bytes, reinterpret_cast<std::uintptr_t>(stream),
               device, capture_site());
  }
  /// The real free of the tracked native allocation `a` at `key`; its books on success, back in
  /// the table otherwise.
  /// `async`: a cudaFreeAsync.
  void free_native(std::uintptr_t key, const Allocation& a, Fallback real, bool async,
                   std::uintptr_t stream);
  /// Remembers the current context as `device`'s (natives_), for the device's figures later.
  void note_current_context(int device);
  /// The cap of `device` in observe mode, resolved against the device's memory at first use.
  void observe_device(int device);
  /// Observe mode's OOM report: the tracked bytes are all the shim holds (reserved = used).
  OomReport describe_native_oom(int device, std::size_t bytes, CUstream stream, bool async) const;
  /// An allocation that failed with out-of-memory: the counters, the record, the wait for it.
  void publish_oom(const OomReport& report);

  std::atomic<bool> warned_foreign_context_{false};
  std::atomic<bool> warned_pool_failure_{false};
  std::atomic<bool> warned_bad_device_{false};
  std::atomic<bool> warned_fallback_{false};
  mutable std::atomic<bool> warned_ordered_fallback_{false};
  std::atomic<bool> warned_ipc_{false};
  std::atomic<bool> warned_ipc_export_{false};
  std::atomic<bool> warned_ipc_broker_{false};
  std::atomic<bool> warned_peer_{false};
};

}  // namespace poolshim
