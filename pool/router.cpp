#include "router.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "clock.h"
#include "free_mode.h"
#include "nvtx_marks.h"
#include "records.h"

namespace poolshim {

namespace {

// The legacy and per-thread default streams belong to whatever context is current.
bool is_default_stream(CUstream s) {
  return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

// The legacy default stream cannot be captured.
// Free memory of the heap below which growing is always preferred to a synchronization.
constexpr std::uint64_t kBoundedSlackMin = 64ULL << 20;

bool is_legacy_stream(CUstream s) {
  return s == nullptr || s == CU_STREAM_LEGACY;
}

std::uint64_t unused_of(const PoolUsage& u) {
  return u.valid && u.reserved > u.used ? u.reserved - u.used : 0;
}

}  // namespace

Router::Router(const DriverApi& driver, const Config& config, EventQueue& events)
    : driver_(driver), config_(config), events_(events) {
  settings_.reuse_follow_event_deps = config.reuse_follow_event_deps;
  settings_.reuse_opportunistic = config.reuse_opportunistic;
  settings_.reuse_internal_deps = config.reuse_internal_deps;
  settings_.cache = config.cache;
  settings_.page = config.page;
  settings_.ipc = config.ipc;
  const FreeMode mode = resolve_free_mode(config.free, loaded_libraries());
  ordered_mode_ = mode.ordered;
  free_mode_why_ = mode.why;
  if (driver_.cuDeviceGetCount(&device_count_) != CUDA_SUCCESS) device_count_ = 0;
  settings_.single_device = device_count_ == 1;
  observe_ = config.mode == "observe";
  ipc_ = std::make_unique<IpcShare>(driver_);
}

Router::~Router() = default;

void Router::warn_once(std::atomic<bool>& flag, std::string text) {
  if (!flag.exchange(true, std::memory_order_relaxed)) events_.push_warning(std::move(text));
}

DevicePool* Router::existing_pool(int device) const {
  return valid_device(device) ? pools_[device].load(std::memory_order_acquire) : nullptr;
}

DevicePool* Router::pool_for(int device) {
  if (!valid_device(device)) {
    warn_once(warned_bad_device_, "device ordinal " + std::to_string(device) +
                                      " is beyond what poolshim tracks (" +
                                      std::to_string(kMaxDevices) + "); its calls pass through");
    return nullptr;
  }
  DevicePool* pool = pools_[device].load(std::memory_order_acquire);
  if (pool != nullptr) return pool;
  if (pool_state_[device].load(std::memory_order_relaxed) == PoolState::failed) return nullptr;

  std::lock_guard<std::mutex> lock(create_mutex_);
  pool = pools_[device].load(std::memory_order_relaxed);
  if (pool != nullptr) return pool;
  if (pool_state_[device].load(std::memory_order_relaxed) == PoolState::failed) return nullptr;
  std::string error;
  PoolSettings settings = settings_;
  settings.cap = limit_option(device);
  auto created = DevicePool::create(driver_, device, settings, &error);
  if (!created) {
    pool_state_[device].store(PoolState::failed, std::memory_order_relaxed);
    warn_once(warned_pool_failure_, "cannot create the pool of device " + std::to_string(device) +
                                        " (" + error + "); its allocations pass through");
    return nullptr;
  }
  pool = created.get();
  if (peers_ != nullptr) {
    for (int from : peers_->accessors(device)) set_pool_access(*pool, from);
  }
  pools_owned_.push_back(std::move(created));
  ever_used_[device].store(true, std::memory_order_relaxed);
  pool_state_[device].store(PoolState::ready, std::memory_order_relaxed);
  pools_[device].store(pool, std::memory_order_release);
  return pool;
}

bool Router::adopt_context(const DevicePool& pool) {
  CUcontext current = nullptr;
  if (driver_.cuCtxGetCurrent(&current) != CUDA_SUCCESS) return false;
  if (current == pool.context()) return true;
  if (current != nullptr) {
    // A context the application made itself (driver API), or a primary context that does
    // not match the runtime's current device: the pool cannot promise the same semantics.
    warn_once(warned_foreign_context_,
              "an allocation was made while a context other than the device's primary context "
              "was current; such allocations pass through unpooled");
    return false;
  }
  // What the runtime itself does on a thread's first call: make the primary context current.
  return driver_.cuCtxSetCurrent(pool.context()) == CUDA_SUCCESS;
}

CUresult Router::take_block(DevicePool& pool, std::size_t bytes, std::uintptr_t token,
                            HeapBlock* out) {
  DeviceHeap& heap = pool.heap();
  FenceClock& fences = pool.fences();
  DeviceStats& s = stats(pool.ordinal());
  const auto from_free = [&](DeviceHeap::Lend lend) {
    return heap.allocate_from_free(bytes, token, fences.completed(), out, lend);
  };
  bool hit = from_free(DeviceHeap::Lend::unheld);
  // Blocks waiting for a fence: the one in flight may have completed by now.
  if (!hit && heap.waiting(fences.completed()) && advance_fences(pool)) {
    hit = from_free(DeviceHeap::Lend::unheld);
  }
  // Free memory worth a new segment: neighbours left apart may merge now. When enough of it
  // lies elsewhere (an eighth of what the heap holds, 64 MiB at least), growing would hold too
  // much beyond live memory: arenas of live threads idle for a period lend theirs (an active
  // thread's free memory is its working set: below that bound, or with none idle, a thread
  // grows its own arena rather than take it), and when enough of it only waits for fences, one
  // synchronization is cheaper than growing by it: what the heap holds beyond live memory stays
  // bounded relative to it. The stall is the native cudaFree's, paid once for many frees.
  const std::uint64_t free = hit ? 0 : heap.free_bytes(token, DeviceHeap::Lend::idle);
  if (!hit && free >= SegmentAllocator::segment_for(bytes)) {
    const bool pressed = free >= kBoundedSlackMin && free >= heap.reserved() / 8;
    const DeviceHeap::Lend lend = pressed ? DeviceHeap::Lend::idle : DeviceHeap::Lend::unheld;
    if (pressed) hit = from_free(lend);
    if (!hit && heap.coalesce(fences.completed(), token, lend) > 0) hit = from_free(lend);
    if (!hit && pressed && heap.waiting(fences.completed(), token, lend) &&
        !capture_in_progress() &&
        synchronize_as_fence(pool, nvtx_marks::Wait::bounded_slack) == CUDA_SUCCESS) {
      s.bump(&CounterShard::bounded_syncs);
      heap.coalesce(fences.completed(), token, lend);
      hit = from_free(lend);
    }
  }
  if (hit) {
    s.bump(&CounterShard::cache_hits);
    return CUDA_SUCCESS;
  }
  s.bump(&CounterShard::cache_misses);
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  if (heap.allocate(bytes, token, fences.completed(), out, &r)) return CUDA_SUCCESS;
  if (r != CUDA_ERROR_OUT_OF_MEMORY || !config_.oom_retry) return r;

  ScopedContext ctx(driver_, pool.context());
  // A retry helps only if the device's free memory plus what the pool and the heap hold unused
  // covers the request; a hopeless request (say 1 TiB) must not cost the heap its segments.
  std::size_t device_free = 0;
  std::size_t total = 0;
  if (driver_.cuMemGetInfo_v2(&device_free, &total) == CUDA_SUCCESS &&
      device_free + unused_of(pool.usage()) + heap.free_bytes() < bytes) {
    return r;
  }
  s.bump(&CounterShard::oom_retries);
  // After a synchronization every free block is usable and every wholly free segment can go
  // back to the pool, which then gives its unused memory back to the device.
  synchronize_as_fence(pool, nvtx_marks::Wait::oom_retry);
  // Any free block now serves, whatever arena holds it: out of memory, no working set is kept.
  heap.coalesce(fences.completed(), token, DeviceHeap::Lend::any);
  if (from_free(DeviceHeap::Lend::any)) {
    s.bump(&CounterShard::oom_retry_successes);
    return CUDA_SUCCESS;
  }
  return_cache(pool, 0);
  nvtx_marks::trim(nvtx_marks::Trim::oom_retry, pool.ordinal(), [&] { return pool.trim_to(0); });
  if (heap.allocate(bytes, token, fences.completed(), out, &r)) {
    s.bump(&CounterShard::oom_retry_successes);
    return CUDA_SUCCESS;
  }
  return r;
}

bool Router::device_memory(const DevicePool& pool, std::uint64_t* free,
                           std::uint64_t* total) const {
  return device_memory(pool.context(), free, total);
}

bool Router::device_memory(CUcontext context, std::uint64_t* free, std::uint64_t* total) const {
  if (context == nullptr) return false;
  ScopedContext ctx(driver_, context);
  std::size_t f = 0;
  std::size_t t = 0;
  if (driver_.cuMemGetInfo_v2(&f, &t) != CUDA_SUCCESS) return false;
  *free = f;
  *total = t;
  return true;
}

OomReport Router::oom_report(int device, std::size_t bytes, CUstream stream, bool async) const {
  OomReport report;
  report.t_ns = now_ns();
  report.device = device;
  report.request = bytes;
  report.stream = reinterpret_cast<std::uintptr_t>(stream);
  report.async = async;
  const DeviceStats& s = stats_[static_cast<std::size_t>(device)];
  report.live_bytes = s.current(&CounterShard::requested_bytes_part);
  report.live_count = s.current(&CounterShard::live_allocs_part);
  return report;
}

OomReport Router::describe_oom(DevicePool& pool, std::size_t bytes, CUstream stream,
                               bool async) const {
  OomReport report = oom_report(pool.ordinal(), bytes, stream, async);
  report.retried = config_.oom_retry;
  report.device_info_valid = device_memory(pool, &report.device_free, &report.device_total);
  const PoolUsage u = pool.usage();
  report.reserved = u.reserved;
  report.used = handed_out(u, pool.heap().free_bytes());  // free blocks of the heap are slack
  report.cap = pool.cap();
  return report;
}

void Router::decline_allocation(DevicePool& pool, std::size_t bytes, CUstream stream, bool async,
                                CUresult pool_result, AllocFallback real) {
  OomReport report;
  const bool pool_oom = pool_result == CUDA_ERROR_OUT_OF_MEMORY;
  if (pool_oom) {
    report = describe_oom(pool, bytes, stream, async);  // the state at the failure
    report.site = capture_site();
    // A failed pool allocation can leave memory reserved in the pool (seen on an H200: a
    // 280 GiB request left 139 GiB reserved and 5 MiB free). Give back every unused byte, the
    // heap's whole free segments first, before the real function tries: it needs that memory,
    // and an application that has just run out should not find it held in a cache.
    return_cache(pool, 0);
    report.released_after =
        nvtx_marks::trim(nvtx_marks::Trim::oom, pool.ordinal(), [&] { return pool.trim_to(0); });
  }
  // Under a cap the real function must not allocate what the pool refused: it is asked for
  // a request it cannot serve, so the application gets the native error and nothing else.
  const bool capped = pool.cap() > 0;
  const RealResult result = pass_through(
      pool.ordinal(), pool_oom && capped ? kRefusedRequest : bytes, stream, async, real, bytes);
  DeviceStats& s = stats(pool.ordinal());
  if (result == RealResult::success) {
    s.bump(&CounterShard::fallback_allocs);
    warn_once(warned_fallback_, std::string("the pool could not serve an allocation (") +
                                    driver_.error_name(pool_result) +
                                    ") that the real function then served; such allocations "
                                    "are counted as fallback_allocs and not pooled");
    return;
  }
  s.bump(&CounterShard::failed_allocs);
  if (result != RealResult::out_of_memory) return;
  if (!pool_oom) {
    report = describe_oom(pool, bytes, stream, async);
    report.site = capture_site();
  }
  publish_oom(report);
}

void Router::publish_oom(const OomReport& report) {
  DeviceStats& s = stats(report.device);
  s.on_oom(oom_verdict_of(report));
  nvtx_marks::mark_oom(report.device, report.request, oom_verdict(report));
  if (unused_of(PoolUsage{report.reserved, 0, report.used, 0, true}) >= report.request) {
    s.bump(&CounterShard::oom_with_slack);
  }
  const std::uint64_t ticket = events_.push_oom(report);
  // The application often aborts right after an OOM: give the record a moment to be written.
  const long long wait_ms = oom_record_wait_ms_.load(std::memory_order_relaxed);
  if (wait_ms > 0) {
    const nvtx_marks::WaitRange wait(nvtx_marks::Wait::oom_record, report.device);
    events_.wait_written(ticket, std::chrono::milliseconds(wait_ms));
  }
}

bool Router::healthy(DevicePool& pool) {
  if (!pool.faulted.load(std::memory_order_relaxed)) return true;
  // An idle stream's query reports a sticky error without waiting for anything.
  const CUresult state = driver_.cuStreamQuery(pool.stream());
  if (state != CUDA_SUCCESS && state != CUDA_ERROR_NOT_READY) return false;
  pool.faulted.store(false, std::memory_order_relaxed);
  return true;
}

bool Router::allocate_sync(int device, std::size_t bytes, CUdeviceptr* out, AllocFallback real) {
  if (observe_) return observe_allocation(device, bytes, nullptr, false, real);
  DevicePool* pool = pool_for(device);
  if (pool == nullptr || !adopt_context(*pool) || !healthy(*pool)) {
    note_passthrough_alloc(device);
    pass_through(device, bytes, nullptr, false, real);
    return false;
  }
  // cudaMalloc's memory is usable from any stream once it returns: a block whose fence has
  // completed, or (legacy rule) one freed in the legacy stream's order, made safe for every
  // stream (order_legacy_handout). A new segment is waited for by the heap's source.
  const bool legacy = legacy_reuse_allowed(*pool);
  HeapBlock b;
  const CUresult r = take_block(*pool, bytes, legacy ? kLegacyToken : 0, &b);
  if (r != CUDA_SUCCESS) {
    decline_allocation(*pool, bytes, nullptr, false, r, real);
    return false;
  }
  if (legacy && b.ready_at > pool->fences().completed() && !order_legacy_handout(*pool, true)) {
    refuse_legacy_handout(*pool, b, bytes, real);
    return false;
  }
  const Allocation a{bytes, b.size, coarse_now_ns(), 0, device, 0, capture_site(), b.arena, b.node};
  table_.insert(b.ptr, a);
  stats(device).on_alloc(bytes);
  note_event(EventAction::allocate, b.ptr, bytes, 0, device, a.site);
  *out = b.ptr;
  return true;
}

bool Router::allocate_async(int device, std::size_t bytes, CUstream stream, CUdeviceptr* out,
                            AllocFallback real) {
  if (observe_) return observe_allocation(device, bytes, stream, true, real);
  DevicePool* pool = app_pool(device) ? nullptr : pool_for(device);
  // A named stream carries its own context; the default streams need the right one current.
  if (pool == nullptr || (is_default_stream(stream) && !adopt_context(*pool)) || !healthy(*pool)) {
    note_passthrough_alloc(device);
    pass_through(device, bytes, stream, true, real);
    return false;
  }
  if (stream == CU_STREAM_PER_THREAD) after_stream_created();
  const std::uintptr_t token = stream_token(stream);
  HeapBlock b;
  const CUresult r = take_block(*pool, bytes, token, &b);
  if (r != CUDA_SUCCESS) {
    decline_allocation(*pool, bytes, stream, true, r, real);
    return false;
  }
  // On the legacy stream, blocking streams may use it too (legacy stream semantics).
  if (token == kLegacyToken && b.ready_at > pool->fences().completed() &&
      !order_legacy_handout(*pool, false)) {
    refuse_legacy_handout(*pool, b, bytes, real);
    return false;
  }
  const Allocation a{bytes,           b.size,
                     coarse_now_ns(), reinterpret_cast<std::uintptr_t>(stream),
                     device,          Allocation::kAsync,
                     capture_site(),  b.arena,
                     b.node};
  table_.insert(b.ptr, a);
  DeviceStats& s = stats(device);
  s.on_alloc(bytes);
  s.bump(&CounterShard::async_allocs);
  note_event(EventAction::allocate, b.ptr, bytes, a.stream, device, a.site);
  *out = b.ptr;
  return true;
}

CUresult Router::synchronize_for_free(const DevicePool& pool) const {
  CUcontext current = nullptr;
  driver_.cuCtxGetCurrent(&current);
  if (current == pool.context()) return driver_.cuCtxSynchronize();
  if (current != nullptr) {
    // Work of the caller's device may reach the block through peer access: wait for it too.
    const CUresult r = driver_.cuCtxSynchronize();
    if (r != CUDA_SUCCESS) return r;
  }
  ScopedContext ctx(driver_, pool.context());
  return driver_.cuCtxSynchronize();
}

RealResult Router::free_on_proxy(std::uintptr_t ptr, const Allocation& a, Fallback real,
                                 bool retire, std::uintptr_t stream) {
  DevicePool* pool = existing_pool(a.device);
  const CUdeviceptr proxy = pool != nullptr ? pool->proxy() : 0;
  // Without a proxy the real function is asked for the block's address, made safe: the driver
  // refuses it (no allocation starts there), with the error of the moment (a sticky one, say).
  const RealResult result = real(proxy != 0 ? reinterpret_cast<void*>(proxy)
                                            : for_real_free(reinterpret_cast<void*>(ptr)));
  if (proxy == 0 || result != RealResult::success) {
    table_.insert(ptr, a);  // still live: a later free must find it
    return result;
  }
  // The real function freed the proxy, so the application's free succeeded: its block is free,
  // but work queued before may still use it (a free during a capture does not synchronize).
  pool->renew_proxy();
  if (retire) {
    stats(a.device).on_free(a.requested);
    stats(a.device).bump(&CounterShard::retired_blocks);
    note_event(EventAction::free, ptr, a.requested, stream, a.device, a.site);
  } else {
    give_block(*pool, ptr, a, 0, pool->fences().next(), stream);
  }
  return result;
}

void Router::free_sync(void* ptr, int caller_device, Fallback real) {
  const auto key = reinterpret_cast<std::uintptr_t>(ptr);
  const std::optional<Allocation> a = take_live(key);
  if (!a) {
    // Not handed out (or freed already): the real function answers natively.
    if (valid_device(caller_device)) stats(caller_device).bump(&CounterShard::passthrough_frees);
    real(for_real_free(ptr));
    return;
  }
  if ((a->flags & Allocation::kNative) != 0) return free_native(key, *a, real, false, 0);
  DevicePool* pool = existing_pool(a->device);
  if (pool != nullptr && ordered_mode_ && ordered_free_possible(*pool)) {
    // Usable once the next fence has completed, or at once in the legacy stream's order. A
    // faulted context must still answer with its sticky error, as the native cudaFree does
    // (seen on an H200): an idle stream's query reports it without waiting for anything.
    const CUresult state = driver_.cuStreamQuery(pool->stream());
    if (state != CUDA_SUCCESS && state != CUDA_ERROR_NOT_READY) {
      pool->faulted.store(true, std::memory_order_relaxed);
    } else {
      give_block(*pool, key, *a, legacy_token_for_free(*pool) ? kLegacyToken : 0,
                 pool->fences().next(), 0);
      stats(a->device).bump(&CounterShard::ordered_frees);
      return;
    }
  }
  // Native cudaFree waits for the device: no work enqueued before it may still touch the block.
  // That synchronization is a fence: the block is ready for any stream once it returns.
  const CUresult r = pool != nullptr ? synchronize_as_fence(*pool, nvtx_marks::Wait::sync_free)
                                     : CUDA_ERROR_INVALID_CONTEXT;
  if (r != CUDA_SUCCESS) {
    // E.g. a sticky error from an earlier kernel: the real cudaFree reports it natively.
    free_on_proxy(key, *a, real);
    return;
  }
  give_block(*pool, key, *a, 0, pool->fences().completed(), 0);
}

const char* Router::unordered_reason(const DevicePool& pool) const {
  if (registry_ == nullptr || !registry_->observed()) {
    return "the application's stream creation was not seen by the shim";
  }
  if (registry_->foreign_context()) return "the application created contexts of its own";
  if (registry_->has_eventless()) return "a stream of the application has no event to order by";
  // Work of another device's context can reach this block (peer access, peer copies): the
  // order of one device's streams proves nothing for it.
  for (int d = 0; d < device_count_; ++d) {
    if (d == pool.ordinal()) continue;
    unsigned int flags = 0;
    int active = 0;
    if (driver_.cuDevicePrimaryCtxGetState(d, &flags, &active) != CUDA_SUCCESS || active != 0) {
      return "more than one device is in use";
    }
  }
  return nullptr;
}

bool Router::ordered_free_possible(const DevicePool& pool) const {
  const char* why = unordered_reason(pool);
  if (why == nullptr) return true;
  if (!warned_ordered_fallback_.exchange(true, std::memory_order_relaxed)) {
    events_.push_warning(std::string("free mode ordered: ") + why +
                         "; such frees synchronize the device as in mode sync");
  }
  return false;
}

CUresult Router::order_free_stream(DevicePool& pool) {
  // An event recorded on the legacy default stream completes after the earlier work of every
  // blocking stream of the context (legacy stream semantics); non-blocking streams each need
  // their own event. The free stream waits for all of them, the application's streams for
  // nothing: no host stall, no new ordering between the application's streams.
  CUresult r = driver_.cuEventRecord(pool.legacy_event(), CU_STREAM_LEGACY);
  if (r == CUDA_SUCCESS) r = driver_.cuStreamWaitEvent(pool.free_stream(), pool.legacy_event(), 0);
  if (r != CUDA_SUCCESS) return r;
  const bool all_waited = registry_->for_each(pool.ordinal(), [&](const StreamRegistry::Entry& e) {
    if (e.event == nullptr) {
      r = CUDA_ERROR_NOT_READY;  // a stream without an event cannot be waited for: sync instead
      return false;
    }
    r = driver_.cuEventRecord(e.event, e.stream);
    if (r == CUDA_SUCCESS) r = driver_.cuStreamWaitEvent(pool.free_stream(), e.event, 0);
    return r == CUDA_SUCCESS;
  });
  return all_waited ? CUDA_SUCCESS : r;
}

// ---- the heap and its reuse rules (DESIGN §7) ----------------------------------------------

std::uintptr_t Router::stream_token(CUstream stream) const {
  if (stream == nullptr || stream == CU_STREAM_LEGACY) return kLegacyToken;
  // The per-thread stream is a different stream on every thread under one handle.
  if (stream == CU_STREAM_PER_THREAD) return 0;
  // A named stream's handle can be reused after it is destroyed: only a destruction the shim
  // sees (before_any_stream_destroy) lets it keep the shortcut safely.
  return registry_ != nullptr && registry_->observed() ? reinterpret_cast<std::uintptr_t>(stream)
                                                       : 0;
}

void Router::give_block(DevicePool& pool, std::uintptr_t ptr, const Allocation& a,
                        std::uintptr_t token, std::uint64_t ready_at, std::uintptr_t stream) {
  // Counted (and recorded) before the block is usable again, so that the live figures never
  // run above it and the event log has this free before the allocation that reuses the block.
  stats(a.device).on_free(a.requested);
  note_event(EventAction::free, ptr, a.requested, stream, a.device, a.site);
  if (token == kLegacyToken) pool.legacy_frees.fetch_add(1, std::memory_order_acq_rel);
  pool.heap().free(a.arena, a.block, a.capacity, token, ready_at, pool.fences().completed());
}

bool Router::legacy_reuse_allowed(DevicePool& pool) {
  if (!config_.legacy_reuse || registry_ == nullptr) return false;
  // Marked before the registry is read (both sequentially consistent): a non-blocking stream
  // listed at the same moment either is seen here, or sees the mark and waits.
  if (!pool.legacy_handouts.load(std::memory_order_seq_cst)) {
    pool.legacy_handouts.store(true, std::memory_order_seq_cst);
  }
  return !registry_->any_listed() && unordered_reason(pool) == nullptr;
}

bool Router::legacy_barrier(DevicePool& pool) {
  // The pool's context is current (adopt_context). Work on the legacy stream waits for every
  // blocking stream's earlier work, and every blocking stream's later work waits for it. One
  // barrier covers every legacy-token free before it.
  const std::uint64_t frees = pool.legacy_frees.load(std::memory_order_acquire);
  if (pool.barrier_covers.load(std::memory_order_acquire) >= frees) return true;
  if (driver_.cuEventRecord(pool.legacy_event(), CU_STREAM_LEGACY) != CUDA_SUCCESS) return false;
  raise_to(pool.barrier_covers, frees, std::memory_order_acq_rel);
  stats(pool.ordinal()).bump(&CounterShard::legacy_reuses);
  return true;
}

bool Router::order_legacy_handout(DevicePool& pool, bool any_stream) {
  // The block's earlier users are ordered before any later work of the legacy stream. While
  // the legacy stream is the only stream in use, that covers every later user (a stream made
  // later waits for the legacy stream first: after_stream_created). Otherwise blocking streams
  // (and per-thread ones) are ordered behind a barrier on the legacy stream; a cudaMalloc's
  // block may also reach a non-blocking stream, which must not have been listed before the
  // barrier (after_stream_listed waits for the last one). Where the barrier cannot order the
  // use, the device is synchronized instead, a fence.
  if (registry_ != nullptr && registry_->legacy_only()) return true;
  const bool listed = any_stream && registry_ != nullptr && registry_->any_listed();
  if (!listed && pool.barrier_covers.load(std::memory_order_acquire) >=
                     pool.legacy_frees.load(std::memory_order_acquire)) {
    return true;  // the last barrier covers it: no driver call
  }
  // A capture may be beginning on another thread (this one saw none when the call came in):
  // counted in flight, then the probe read, against capture_counted's count, then wait. Both
  // sides fence, so that at least one sees the other.
  pool.legacy_orderings.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const bool refused = capture_in_progress();
  if (!refused) {
    const bool ordered = legacy_barrier(pool) && !listed;
    if (!ordered) synchronize_as_fence(pool, nvtx_marks::Wait::legacy_handout);
  }
  pool.legacy_orderings.fetch_sub(1, std::memory_order_release);
  return !refused;
}

void Router::refuse_legacy_handout(DevicePool& pool, const HeapBlock& b, std::size_t bytes,
                                   AllocFallback real) {
  pool.heap().free(b.arena, b.node, b.size, kLegacyToken, b.ready_at, pool.fences().completed());
  note_passthrough_alloc(pool.ordinal());
  pass_through(pool.ordinal(), bytes, nullptr, false, real);
}

bool Router::legacy_token_for_free(DevicePool& pool) const {
  // Called where ordered_free_possible() holds. Without a non-blocking stream, every stream
  // that may still use the block is a blocking one, which the legacy stream orders; a
  // non-blocking stream destroyed before may still run work on it until a fence completes.
  return config_.legacy_reuse && !registry_->any_listed() &&
         pool.fences().completed() >= pool.legacy_reuse_after.load(std::memory_order_acquire);
}

void Router::after_stream_created() {
  // The first stream beyond the legacy one ends the rule that needs no barrier. Blocks handed
  // out under it are covered from here on by one barrier recorded now, which every blocking
  // stream's later work and every non-blocking stream listed later (after_stream_listed) waits
  // for. No capture can be in progress yet: a capture needs a stream the application made, or
  // the per-thread stream, whose capture ends the rule before it is counted (shim's
  // capture_began); only a stream the shim never saw made could be captured first.
  if (registry_ == nullptr || !registry_->mark_not_legacy_only()) return;
  if (capture_in_progress()) return;
  for (int d = 0; d < kMaxDevices; ++d) {
    DevicePool* pool = existing_pool(d);
    if (pool == nullptr || !pool->legacy_handouts.load(std::memory_order_seq_cst)) continue;
    ScopedContext ctx(driver_, pool->context());
    legacy_barrier(*pool);
  }
}

void Router::after_stream_listed(const StreamRegistry::Entry& entry) {
  DevicePool* pool = valid_device(entry.device) ? existing_pool(entry.device) : nullptr;
  if (pool == nullptr || !pool->legacy_handouts.load(std::memory_order_seq_cst)) return;
  // The event's last record is behind every block handed out before it (a handout records
  // after taking its block, and one that records after this wait sees the stream listed and
  // synchronizes instead). Nothing is recorded here: a capture may be in progress elsewhere,
  // and the legacy stream must not gain work then.
  driver_.cuStreamWaitEvent(entry.stream, pool->legacy_event(), 0);
}

CUresult Router::synchronize_as_fence(DevicePool& pool, nvtx_marks::Wait why) {
  const nvtx_marks::WaitRange wait(why, pool.ordinal());
  FenceClock& fences = pool.fences();
  const std::uint64_t k = fences.start();
  const CUresult r = synchronize_for_free(pool);
  if (r == CUDA_SUCCESS) {
    fences.complete(k);
  } else {
    pool.faulted.store(true, std::memory_order_relaxed);
  }
  return r;
}

bool Router::advance_fences(DevicePool& pool, bool may_start) {
  std::unique_lock<std::mutex> lock(pool.fence_mutex(), std::try_to_lock);
  if (!lock.owns_lock()) return false;  // another thread is at it
  FenceClock& fences = pool.fences();
  const std::uint64_t before = fences.completed();
  ScopedContext ctx(driver_, pool.context());
  if (pool.fence_in_flight != 0) {
    const CUresult q = driver_.cuEventQuery(pool.fence_event());
    if (q == CUDA_ERROR_NOT_READY) return false;
    // An error (say a sticky one from a faulted kernel) proves nothing: the fence is dropped
    // and its blocks wait for the next one.
    if (q == CUDA_SUCCESS) fences.complete(pool.fence_in_flight);
    pool.fence_in_flight = 0;
  }
  // Only an event behind every stream of the device makes a fence without a host stall; where
  // the streams' order proves nothing, blocks wait for a synchronizing cudaFree or an OOM.
  // Nothing is recorded on the application's streams while a capture is in progress anywhere
  // (a record would join it); capture_counted() waits for a start that read none.
  if (may_start && pool.heap().waiting(fences.completed()) && unordered_reason(pool) == nullptr &&
      !capture_in_progress()) {
    const std::uint64_t k = fences.start();
    DeviceStats& s = stats(pool.ordinal());
    s.bump(&CounterShard::fences);
    if (order_free_stream(pool) == CUDA_SUCCESS &&
        driver_.cuEventRecord(pool.fence_event(), pool.free_stream()) == CUDA_SUCCESS) {
      if (driver_.cuEventQuery(pool.fence_event()) == CUDA_SUCCESS) {
        fences.complete(k);
      } else {
        pool.fence_in_flight = k;
      }
    }
  }
  return fences.completed() > before;
}

void Router::before_any_stream_destroy(CUstream stream) {
  stream_epoch_.fetch_add(1, std::memory_order_acq_rel);
  for (int d = 0; d < kMaxDevices; ++d) {
    if (DevicePool* pool = existing_pool(d)) {
      pool->heap().forget_affinity(reinterpret_cast<std::uintptr_t>(stream));
    }
  }
}

std::uint64_t Router::tend_heap(int device, std::uint64_t now) {
  std::lock_guard<std::mutex> lock(create_mutex_);  // not racing a device reset's release
  DevicePool* pool = existing_pool(device);
  if (pool == nullptr) return 0;
  pool->heap().tick(now);
  if (pool->heap().free_bytes() == 0) return 0;
  RelaxedCaptureScope relaxed(driver_);
  // Polls the fence in flight and starts the next one while blocks wait for it (not during a
  // capture: advance_fences), so that blocks freed on non-blocking streams, which hits never
  // fence, become ready for every stream and for the trim below within two ticks.
  advance_fences(*pool, true);
  // Whole free segments beyond what is kept go back to the pool (which keeps them until it is
  // trimmed: idle trim, out-of-memory).
  DeviceHeap& heap = pool->heap();
  const std::uint64_t keep = heap.allocated() + pool->heap_keep();
  return return_cache(*pool, keep);
}

std::uint64_t Router::return_cache(DevicePool& pool, std::uint64_t keep) {
  const std::uint64_t returned = pool.heap().trim(keep, pool.fences().completed());
  if (returned > 0) {
    stats(pool.ordinal()).bump(&CounterShard::cache_returns);
    nvtx_marks::mark_cache_return(pool.ordinal(), returned);
  }
  return returned;
}

void Router::wait_for_stream_at_destroy(const StreamRegistry::Entry& entry) {
  DevicePool* pool = existing_pool(entry.device);
  if (pool == nullptr) return;
  if (entry.event == nullptr) {
    // Nothing can wait for its last work: cudaFree'd blocks never take the legacy shortcut.
    pool->legacy_reuse_after.store(UINT64_MAX, std::memory_order_release);
    return;
  }
  ScopedContext ctx(driver_, pool->context());
  if (driver_.cuEventRecord(entry.event, entry.stream) == CUDA_SUCCESS) {
    driver_.cuStreamWaitEvent(pool->free_stream(), entry.event, 0);
  }
  // Blocks cudaFree'd from now on may have been used on this stream: no legacy shortcut for
  // them before the next fence, which is behind this wait.
  raise_to(pool->legacy_reuse_after, pool->fences().next(), std::memory_order_release);
}

void Router::release_stream_event(const StreamRegistry::Entry& entry) {
  // Released by the driver once the free stream's wait on it is done.
  if (entry.event != nullptr) driver_.cuEventDestroy_v2(entry.event);
}

void Router::free_async(void* ptr, CUstream stream, Fallback real) {
  const auto key = reinterpret_cast<std::uintptr_t>(ptr);
  const std::optional<Allocation> a = take_live(key);
  if (!a) {
    const int device = current_device();
    if (valid_device(device)) stats(device).bump(&CounterShard::passthrough_frees);
    real(for_real_free(ptr));
    return;
  }
  const auto s = reinterpret_cast<std::uintptr_t>(stream);
  if ((a->flags & Allocation::kNative) != 0) return free_native(key, *a, real, true, s);
  DevicePool* pool = existing_pool(a->device);
  if (pool == nullptr || !healthy(*pool)) {
    free_on_proxy(key, *a, real, false, s);  // the real function answers (the sticky error)
    return;
  }
  if (stream == CU_STREAM_PER_THREAD) after_stream_created();
  // Only a free in the order of a stream of the block's own device and primary context is
  // kept with the stream's token: the block's later users (that stream at once, others after a
  // fence of this device) are ordered behind no other context's streams.
  bool own_stream = false;
  if (is_default_stream(stream)) {
    // The default streams are the current context's; a thread with none gets the block's
    // device's primary context, as the runtime would give it its current device's.
    CUcontext current = nullptr;
    driver_.cuCtxGetCurrent(&current);
    if (current == nullptr && driver_.cuCtxSetCurrent(pool->context()) == CUDA_SUCCESS) {
      current = pool->context();
    }
    own_stream = current == pool->context();
  } else {
    own_stream = stream_device(stream) == a->device &&
                 (registry_ == nullptr || !registry_->foreign_context());
  }
  if (own_stream) {
    give_block(*pool, key, *a, stream_token(stream), pool->fences().next(), s);
  } else {
    // Another context's stream: no fence of this device covers its work. Its work up to the
    // free is waited for (a rare path), after which the block is free for every stream.
    const nvtx_marks::WaitRange wait(nvtx_marks::Wait::foreign_stream, a->device);
    const CUresult r = driver_.cuStreamSynchronize(stream);
    if (r != CUDA_SUCCESS) {
      free_on_proxy(key, *a, real, false, s);
      return;
    }
    give_block(*pool, key, *a, 0, 0, s);
  }
  stats(a->device).bump(&CounterShard::async_frees);
}

int Router::current_device() const {
  CUdevice device = -1;
  return driver_.cuCtxGetDevice(&device) == CUDA_SUCCESS ? static_cast<int>(device) : -1;
}

int Router::stream_device(CUstream stream) const {
  // A thread mostly allocates on one stream: its device is remembered, so that the hot path
  // makes no driver call (cuStreamGetDevice serializes threads in the driver). A stream
  // destruction the shim sees, or a device reset, forgets every remembered stream.
  struct Memo {
    const Router* router = nullptr;
    CUstream stream = nullptr;
    std::uint64_t epoch = 0;
    int device = -1;
  };
  static thread_local Memo memo;
  const std::uint64_t epoch = stream_epoch_.load(std::memory_order_acquire);
  if (memo.router == this && memo.stream == stream && memo.epoch == epoch) return memo.device;
  CUdevice device = -1;
  if (driver_.cuStreamGetDevice(stream, &device) != CUDA_SUCCESS) return -1;
  memo = Memo{this, stream, epoch, static_cast<int>(device)};
  return memo.device;
}

void Router::free_unrouted(void* ptr, int caller_device, Fallback real, bool async,
                           CUstream stream) {
  const auto key = reinterpret_cast<std::uintptr_t>(ptr);
  // Taken before the real call, so that the address cannot be handed out again (and recorded
  // twice) while the real function answers; put back if it did not free.
  const std::optional<Allocation> a = take_live(key);
  const int device = a ? a->device : caller_device;
  if (valid_device(device)) stats(device).bump(&CounterShard::passthrough_frees);
  if (!a) {
    real(for_real_free(ptr));
    return;
  }
  const auto s = async ? reinterpret_cast<std::uintptr_t>(stream) : 0;
  if ((a->flags & Allocation::kNative) != 0) return free_native(key, *a, real, async, s);
  // A cudaFreeAsync on a capturing stream becomes a free node of the graph, which frees when
  // (and each time) the graph runs: the block can never be known free again.
  CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  const bool retire = async && !is_legacy_stream(stream) &&
                      driver_.cuStreamIsCapturing(stream, &capturing) == CUDA_SUCCESS &&
                      capturing != CU_STREAM_CAPTURE_STATUS_NONE;
  free_on_proxy(key, *a, real, retire, s);
}

void* Router::for_real_free(void* ptr) const {
  // A segment's base is the start of a pool allocation to the driver, which would free the
  // whole segment under its live blocks. An address inside it is no allocation's start: the
  // driver refuses it as it refuses a pointer freed before (both CUDA_ERROR_INVALID_VALUE).
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  for (int d = 0; d < kMaxDevices; ++d) {
    const DevicePool* pool = existing_pool(d);
    if (pool != nullptr && pool->is_segment_base(p)) return static_cast<char*>(ptr) + 256;
  }
  return ptr;
}

void Router::before_capture() {
  for (int d = 0; d < kMaxDevices; ++d) {
    DevicePool* pool = existing_pool(d);
    if (pool != nullptr && pool->proxy() == 0) pool->renew_proxy();
  }
}

void Router::capture_counted() {
  // A fence start checks the probe under the pool's fence mutex: one that read no capture
  // finishes its records before this returns; one after it sees the capture. A legacy handout
  // counts itself in flight before it reads the probe (order_legacy_handout): one that read
  // none has finished its record or synchronization once its count is gone.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int d = 0; d < kMaxDevices; ++d) {
    DevicePool* pool = existing_pool(d);
    if (pool == nullptr) continue;
    { std::lock_guard<std::mutex> gate(pool->fence_mutex()); }
    while (pool->legacy_orderings.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  }
}

void Router::note_passthrough_alloc(int device) {
  if (valid_device(device)) stats(device).bump(&CounterShard::passthrough_allocs);
}

void Router::set_pool_access(DevicePool& pool, int from) {
  if (from == pool.ordinal()) return;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = from;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult r = driver_.cuMemPoolSetAccess(pool.handle(), &access, 1);
  if (r != CUDA_SUCCESS) {
    warn_once(warned_peer_, "cannot open the pool of device " + std::to_string(pool.ordinal()) +
                                " to peer device " + std::to_string(from) + " (" +
                                driver_.error_name(r) +
                                "): kernels of that device cannot reach its pooled memory");
  }
}

void Router::open_pool_to(int to, int from) {
  std::lock_guard<std::mutex> lock(create_mutex_);  // not racing a pool's creation
  DevicePool* pool = existing_pool(to);
  if (pool != nullptr) set_pool_access(*pool, from);
}

void Router::note_ipc_failure(const void* ptr) {
  if (!table_.find(reinterpret_cast<std::uintptr_t>(ptr))) return;
  warn_once(warned_ipc_,
            "a legacy IPC export (cudaIpcGetMemHandle/cuIpcGetMemHandle) failed for memory "
            "poolshim allocated: only blocks over 1 MiB of a paged arena (page > 0, one device, "
            "ipc=1) can be exported. Run this program with POOLSHIM_ENABLE=0 if it exports "
            "smaller blocks");
}

std::optional<Allocation> Router::take_live(std::uintptr_t key) {
  std::optional<Allocation> a = table_.take(key);
  if (a && (a->flags & Allocation::kExported) != 0) ipc_->forget(key);
  return a;
}

bool Router::ipc_export(CUdeviceptr ptr, void* handle) {
  const std::optional<Allocation> a = table_.find(ptr);
  DevicePool* pool = a ? existing_pool(a->device) : nullptr;
  if (pool == nullptr || !pool->pages_exportable()) return false;
  const PageMap* pages = pool->heap().pages_of(ptr);
  if (pages == nullptr) return false;
  std::string why;
  if (!ipc_->export_block(IpcShare::Block{ptr, a->requested, pool->context(), pages}, handle,
                          &why)) {
    warn_once(warned_ipc_broker_, "legacy IPC of pooled memory is off: " + why);
    return false;
  }
  // Freed meanwhile by another thread: its export goes with it.
  if (!table_.add_flags(ptr, Allocation::kExported)) ipc_->forget(ptr);
  warn_once(warned_ipc_export_,
            "pooled memory was exported through legacy IPC: its handle opens only in a process "
            "that also runs under poolshim (LD_PRELOAD, which children inherit), through the "
            "socket " +
                ipc_->broker().socket_path(getpid()) +
                " (this user only); elsewhere cudaIpcOpenMemHandle fails with its native error "
                "for a handle that is not the driver's");
  return true;
}

CUresult Router::ipc_open(const void* handle, CUdeviceptr* out) {
  return ipc_->open(handle, out);
}

bool Router::ipc_close(CUdeviceptr ptr, CUresult* result) {
  return ipc_->close(ptr, result);
}

void Router::ipc_forget_in_child() {
  ipc_->forget_in_child();
}

void Router::ipc_stop() {
  ipc_->stop();
}

std::uint32_t Router::capture_site() {
  if (config_.backtrace <= 0) return 0;
  return poolshim::capture_site(sites_, config_.backtrace, own_code_begin_, own_code_end_);
}

std::uint64_t Router::cap(int device) const {
  if (observe_) return natives_.cap(device);
  const DevicePool* pool = existing_pool(device);
  return pool != nullptr ? pool->cap() : 0;
}

SizeValue Router::limit_option(int device) const {
  const auto own = config_.device_limits.find(device);
  return own != config_.device_limits.end() ? own->second : config_.limit;
}

void Router::note_app_pool_alloc(int device) {
  if (valid_device(device)) stats(device).bump(&CounterShard::app_pool_allocs);
}

void Router::adjust_memory_info(int device, std::size_t* free, std::size_t* total) const {
  if (observe_) {
    // Under a cap the application sees a device of the cap's size, as in pool mode.
    const std::uint64_t t = natives_.cap(device);
    if (t == 0) return;
    const std::uint64_t live = natives_.live_bytes(device);
    *free = static_cast<std::size_t>(std::min<std::uint64_t>(*free, live < t ? t - live : 0));
    *total = static_cast<std::size_t>(t);
    return;
  }
  const DevicePool* pool = existing_pool(device);
  if (pool == nullptr) return;
  RelaxedCaptureScope relaxed(driver_);  // cudaMemGetInfo is legal during a capture
  const PoolUsage u = pool->usage();
  // Held but not handed out (unused in the pool, or cached): free for the application.
  const std::uint64_t cached = pool->heap().free_bytes();
  std::uint64_t f = *free + unused_of(u) + cached;
  std::uint64_t t = *total;
  if (pool->cap() > 0) {
    // Under a cap the application sees a device of the cap's size.
    t = pool->cap();
    const std::uint64_t in_use = handed_out(u, cached);
    const std::uint64_t headroom = u.valid && in_use < t ? t - in_use : 0;
    f = std::min(f, headroom);
  }
  *free = static_cast<std::size_t>(std::min(f, t));
  *total = static_cast<std::size_t>(t);
}

std::uint64_t Router::unused_bytes(int device) const {
  const DevicePool* pool = existing_pool(device);
  if (pool == nullptr) return 0;
  RelaxedCaptureScope relaxed(driver_);  // cudaMemGetInfo is legal during a capture
  return unused_of(pool->usage()) + pool->heap().free_bytes();
}

void Router::set_app_pool(int device, bool app_owned) {
  if (valid_device(device)) app_pool_[device].store(app_owned, std::memory_order_relaxed);
}

bool Router::app_pool(int device) const {
  return valid_device(device) && app_pool_[device].load(std::memory_order_relaxed);
}

void Router::before_device_reset(int device) {
  if (!valid_device(device)) return;
  stream_epoch_.fetch_add(1, std::memory_order_acq_rel);  // the device's streams are gone
  std::lock_guard<std::mutex> lock(create_mutex_);
  DevicePool* pool = pools_[device].exchange(nullptr, std::memory_order_acq_rel);
  pool_state_[device].store(PoolState::none, std::memory_order_relaxed);
  app_pool_[device].store(false, std::memory_order_relaxed);  // the reset restores the default
  // The object stays owned (a racing thread may still hold it); its driver objects go now,
  // and the cached blocks with the pool's memory.
  if (pool != nullptr) pool->release();
  DeviceStats& s = stats(device);
  // The reset destroys the device's streams and events too: forget them without touching them.
  if (registry_ != nullptr) registry_->drop_device(device);
  table_.drop_device(device, [this, &s](std::uintptr_t ptr, const Allocation& a) {
    if ((a.flags & Allocation::kExported) != 0) ipc_->forget(ptr);
    // A pass-through allocation was never in the pooled figures (observe mode's are).
    if ((a.flags & Allocation::kNative) == 0 || observe_) s.on_dropped(a.requested);
  });
  natives_.forget_device(device);
  vmm_.drop_device(device);
}

// ---- allocations the real function served, tracked (observe mode, pass-through) ----------

void Router::note_vmm_create(std::uint64_t handle, std::size_t bytes,
                             const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return;
  const int device = prop->location.id;
  vmm_.record_create(handle, bytes, device, capture_site());
  if (!valid_device(device)) return;
  note_current_context(device);
  ever_used_[device].store(true, std::memory_order_release);
}

void Router::note_current_context(int device) {
  if (natives_.context(device) != nullptr) return;
  CUcontext current = nullptr;
  if (driver_.cuCtxGetCurrent(&current) == CUDA_SUCCESS) natives_.note_context(device, current);
}

void Router::observe_device(int device) {
  if (natives_.cap_known(device)) return;
  // The cap as the pool takes it (DevicePool::create): a share of the device's memory resolved
  // against it, and a cap the device cannot reach is none.
  const SizeValue limit = limit_option(device);
  std::uint64_t cap = 0;
  CUdevice dev = 0;
  std::size_t total = 0;
  if ((limit.bytes > 0 || limit.is_percent) && driver_.cuDeviceGet(&dev, device) == CUDA_SUCCESS &&
      driver_.cuDeviceTotalMem_v2(&total, dev) == CUDA_SUCCESS) {
    cap = limit.resolve(total);
    if (cap >= total) cap = 0;
  }
  natives_.set_cap_once(device, cap);
  ever_used_[device].store(true, std::memory_order_release);
}

bool Router::observe_allocation(int device, std::size_t bytes, CUstream stream, bool async,
                                AllocFallback real) {
  CUdeviceptr native = 0;
  if (!valid_device(device)) {
    real(bytes, &native);
    return false;
  }
  observe_device(device);
  DeviceStats& s = stats(device);
  if (!natives_.admit(device, bytes)) {
    // Past the cap: the real function is asked for what it cannot serve, so the application
    // gets the native out-of-memory error, as on a device of the cap's size.
    OomReport report = describe_native_oom(device, bytes, stream, async);
    report.site = capture_site();
    const RealResult r = real(kRefusedRequest, &native);
    s.bump(&CounterShard::failed_allocs);
    note_failure(device, bytes, stream);
    if (r == RealResult::out_of_memory) publish_oom(report);
    return false;
  }
  const RealResult r = real(bytes, &native);
  if (r != RealResult::success || native == 0) {
    natives_.release(device, bytes);
    if (r == RealResult::success) return false;  // nothing to track (no address seen)
    s.bump(&CounterShard::failed_allocs);
    note_failure(device, bytes, stream);
    if (r == RealResult::out_of_memory) {
      OomReport report = describe_native_oom(device, bytes, stream, async);
      report.site = capture_site();
      publish_oom(report);
    }
    return false;
  }
  track_native(native, device, bytes, stream, async);
  s.on_alloc(bytes);
  if (async) s.bump(&CounterShard::async_allocs);
  return false;
}

RealResult Router::pass_through(int device, std::size_t bytes, CUstream stream, bool async,
                                AllocFallback real, std::size_t asked) {
  CUdeviceptr native = 0;
  const RealResult r = real(bytes, &native);
  if (r != RealResult::success) note_failure(device, asked != 0 ? asked : bytes, stream);
  // Pool mode sets no cap in natives_: the admission only counts.
  if (r == RealResult::success && native != 0 && valid_device(device) &&
      natives_.admit(device, bytes)) {
    track_native(native, device, bytes, stream, async);
  }
  return r;
}

void Router::track_native(CUdeviceptr ptr, int device, std::size_t bytes, CUstream stream,
                          bool async) {
  note_current_context(device);
  natives_.made(device);
  const Allocation a{bytes,           bytes,
                     coarse_now_ns(), async ? reinterpret_cast<std::uintptr_t>(stream) : 0,
                     device,          Allocation::kNative | (async ? Allocation::kAsync : 0),
                     capture_site(),  0,
                     nullptr};
  table_.insert(ptr, a);
  note_event(EventAction::allocate, ptr, bytes, a.stream, device, a.site);
}

void Router::free_native(std::uintptr_t key, const Allocation& a, Fallback real, bool async,
                         std::uintptr_t stream) {
  if (real(reinterpret_cast<void*>(key)) != RealResult::success) {
    table_.insert(key, a);  // still live (a sticky error, say): a later free must find it
    return;
  }
  // After the real free (only a free that happened is recorded): another thread's allocation
  // of the same address may, rarely, be recorded first (DESIGN §5.1).
  note_event(EventAction::free, key, a.requested, stream, a.device, a.site);
  natives_.release(a.device, a.requested);
  natives_.freed(a.device);
  if (!observe_) return;
  stats(a.device).on_free(a.requested);
  if (async) stats(a.device).bump(&CounterShard::async_frees);
}

OomReport Router::describe_native_oom(int device, std::size_t bytes, CUstream stream,
                                      bool async) const {
  OomReport report = oom_report(device, bytes, stream, async);
  // The caller's context is the device's (the real function has just run in it).
  std::size_t f = 0;
  std::size_t t = 0;
  report.device_info_valid = driver_.cuMemGetInfo_v2(&f, &t) == CUDA_SUCCESS;
  report.device_free = f;
  report.device_total = t;
  // All the shim holds is what the application holds: no pool, no slack.
  report.reserved = report.used = natives_.live_bytes(device);
  report.cap = natives_.cap(device);
  report.observe = true;
  return report;
}

std::vector<int> Router::active_devices() const {
  std::vector<int> out;
  for (int d = 0; d < kMaxDevices; ++d) {
    if (ever_used_[d].load(std::memory_order_relaxed)) out.push_back(d);
  }
  return out;
}

DeviceSnapshot Router::snapshot(int device) const {
  DeviceSnapshot snap;
  snap.device = device;
  if (!valid_device(device)) return snap;
  snap.stats = take_snapshot(stats_[static_cast<std::size_t>(device)]);
  snap.native_bytes = natives_.live_bytes(device);
  snap.native_bytes_peak = natives_.peak_bytes(device);
  snap.native_allocs = natives_.live_count(device);
  snap.observe = observe_;
  snap.vmm = vmm_.snapshot(device);
  const DevicePool* pool = observe_ ? nullptr : existing_pool(device);
  if (pool == nullptr) {
    // No pool (observe mode, or only the application's own calls so far): the device's figures
    // in the context its first tracked call was made in.
    snap.cap = natives_.cap(device);
    snap.device_info_valid =
        device_memory(natives_.context(device), &snap.device_free, &snap.device_total);
    return snap;
  }
  snap.pool = pool->usage();
  snap.cached_bytes = pool->heap().free_bytes();
  snap.cached_bytes_peak = pool->heap().free_peak();
  snap.cap = pool->cap();
  snap.device_info_valid = device_memory(*pool, &snap.device_free, &snap.device_total);
  return snap;
}

std::uint64_t Router::trim_idle(int device, std::uint64_t keep_reserved) {
  std::lock_guard<std::mutex> lock(create_mutex_);  // not racing a device reset's release
  DevicePool* pool = existing_pool(device);
  if (pool == nullptr) return 0;
  // An idle pool keeps no free segment beyond what is kept: they go back, then the pool's trim.
  // Blocks no event fence can reach (say, two devices in use) get the one synchronization here,
  // while nothing runs.
  DeviceHeap& heap = pool->heap();
  if (heap.waiting(pool->fences().completed()) && !capture_in_progress()) {
    synchronize_as_fence(*pool, nvtx_marks::Wait::idle_trim);
  }
  // Pages of paged arenas go straight back to the driver (cuMemUnmap/cuMemRelease), not
  // through the pool: they count as given back, or an idle trim that returned only pages would
  // read as "nothing left to give" and stop the next ticks, leaving a page's worth cached.
  const std::uint64_t returned = return_cache(*pool, keep_reserved);
  const std::uint64_t released = nvtx_marks::trim(nvtx_marks::Trim::idle, device,
                                                  [&] { return pool->trim_to(keep_reserved); });
  if (released > 0) {
    DeviceStats& s = stats(device);
    s.bump(&CounterShard::idle_trims);
    s.bump(&CounterShard::idle_trimmed_bytes, released);
  }
  return returned + released;
}

std::vector<LiveAllocation> Router::live_allocations() const {
  std::vector<LiveAllocation> out;
  table_.for_each([&out](std::uintptr_t ptr, const Allocation& a) { out.push_back({ptr, a}); });
  return out;
}

std::vector<DeviceDescription> Router::describe_devices() const {
  std::vector<DeviceDescription> out;
  int count = 0;
  if (driver_.cuDeviceGetCount(&count) != CUDA_SUCCESS) return out;
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    if (driver_.cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    DeviceDescription d;
    d.ordinal = i;
    char name[256] = {};
    if (driver_.cuDeviceGetName(name, sizeof name - 1, dev) == CUDA_SUCCESS) d.name = name;
    std::size_t total = 0;
    if (driver_.cuDeviceTotalMem_v2(&total, dev) == CUDA_SUCCESS) d.total = total;
    out.push_back(d);
  }
  return out;
}

std::uint64_t Router::pooled_allocations() const {
  if (observe_) return 0;  // its counters count tracked native allocations
  std::uint64_t n = 0;
  for (const auto& s : stats_) {
    for (const auto& shard : s.shards) n += shard.allocs.load(std::memory_order_relaxed);
  }
  return n;
}

}  // namespace poolshim
