// The shim's process-wide state and the few things every hook needs: the re-entry guard, the
// lazily started core, and the record of stream captures in progress (DESIGN §1, §3).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "router.h"

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

/// True while some stream capture that the shim saw begin has not ended: allocation calls
/// then pass through unchanged, so a capture sees exactly the native behaviour.
bool captures_active();
void capture_began(cudaStream_t stream);
void capture_ended(cudaStream_t stream);

/// How a real runtime call fared, for the counters.
inline RealResult classify(cudaError_t e) {
  if (e == cudaSuccess) return RealResult::success;
  return e == cudaErrorMemoryAllocation ? RealResult::out_of_memory : RealResult::error;
}

}  // namespace poolshim::shim
