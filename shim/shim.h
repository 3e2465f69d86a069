// The shim's process-wide state and the few things every hook needs: the re-entry guard, the
// lazily started core, and the record of stream captures in progress (DESIGN §1, §3).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "router.h"
#include "stream_registry.h"

#define POOLSHIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace poolshim::shim {

/// Marks the calling thread as inside a hook. A hook entered while another is active on the
/// same thread (a real function calling back into an exported name) passes straight through.
class HookScope {
 public:
  HookScope();
  ~HookScope();
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
  bool outermost() const { return outermost_; }

 private:
  bool outermost_;
};

/// The core, started on the first call that reaches it; nullptr when calls must pass through
/// (disabled, starting on another thread, failed to start, exiting, or a forked child of a
/// process that had started).
Router* router_for_call();

/// The core if it is running, without starting it (bookkeeping hooks use it).
Router* router_if_running();

/// Called by the allocation hooks after each allocation that succeeded, pooled or made by the
/// real function (observe mode, pass-through, the application's VMM memory); cheap after the first:
/// registers the exit handler again, late enough to run before the CUDA runtime's and driver's own
/// teardown.
void note_device_allocation();

/// How many calls each way in reached the shim (the exit record's `paths`).
struct PathCounters {
  ShardedCounter runtime_calls;         // outermost runtime allocation/free hooks
  ShardedCounter driver_calls;          // outermost driver allocation/free hooks
  ShardedCounter dlsym_answers;         // dlsym lookups answered with a hook
  ShardedCounter proc_address_answers;  // cuGetProcAddress answers with a hook
  ShardedCounter per_thread_watches;    // per-thread variants handed out as watching thunks
};
PathCounters& paths();

/// The application has a stream other than the legacy default stream (it made one, or calls
/// a function on the per-thread default stream): the legacy rule's barrier-free case ends.
void note_stream_beyond_legacy();

/// The application's non-blocking streams (ordered frees), kept before the core starts too.
StreamRegistry& streams();

/// Peer access was enabled from device `from` to `to` (runtime or driver hook): remember it
/// for pools made later and open `to`'s pool now if the core runs.
void note_peer_access(int from, int to, Router* router);

/// True while some stream capture that the shim saw begin has not ended: allocation calls
/// then pass through unchanged, so a capture sees exactly the native behaviour.
bool captures_active();
/// Called before the real begin (so that no call slips in between); capture_ended undoes it
/// when the begin failed, and at the end of the capture.
void capture_began(cudaStream_t stream);
void capture_ended(cudaStream_t stream);

/// False in a forked child of a process whose core had started: hooks then touch no shim
/// state at all (the parent's locks may have been copied held).
bool bookkeeping_allowed();

/// POOLSHIM_MODE=observe: every call goes to the real function and the shim makes no CUDA call
/// of its own on the application's behalf (no stream's event, no fence).
bool observe_mode();

/// How a real runtime call fared, for the counters.
inline RealResult classify(cudaError_t e) {
  if (e == cudaSuccess) return RealResult::success;
  return e == cudaErrorMemoryAllocation ? RealResult::out_of_memory : RealResult::error;
}

/// classify, and the address a real allocation wrote in `*out` (0 when it failed): the core
/// tracks allocations the real function serves (observe mode, pass-through).
inline RealResult served(cudaError_t e, void* const* out, CUdeviceptr* native) {
  *native = e == cudaSuccess ? reinterpret_cast<CUdeviceptr>(*out) : 0;
  return classify(e);
}

}  // namespace poolshim::shim
