// Runtime-API hooks (DESIGN §2): the exported cuda* names that programs linking libcudart.so
// dynamically reach. Each is a few lines: guard, ask for the core, hand it the call with the
// real function as the fallback, return what the application must see.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "real_runtime.h"
#include "router.h"
#include "shim.h"

using poolshim::RealResult;
using poolshim::Router;
using poolshim::shim::captures_active;
using poolshim::shim::classify;
using poolshim::shim::HookScope;
using poolshim::shim::router_for_call;
using poolshim::shim::served;
namespace real = poolshim::real;

namespace {

// The core when this call may be routed: outermost hook, core running, no capture anywhere.
Router* routable(const HookScope& scope) {
  if (!scope.outermost()) return nullptr;
  Router* router = router_for_call();
  if (router == nullptr) return nullptr;
  poolshim::shim::paths().runtime_calls.add();
  return captures_active() ? nullptr : router;
}

// The core for a free (no capture check: a capture changes how a free is made, not whether).
Router* routable_free(const HookScope& scope) {
  if (!scope.outermost()) return nullptr;
  Router* router = router_for_call();
  if (router != nullptr) poolshim::shim::paths().runtime_calls.add();
  return router;
}

// Counts an allocation call the core did not route although it was running.
void count_unrouted_alloc(const HookScope& scope) {
  if (!scope.outermost()) return;
  if (Router* router = router_for_call()) router->note_passthrough_alloc(router->current_device());
}

// In a per-thread-default-stream build, stream 0 is the calling thread's default stream.
CUstream driver_stream(cudaStream_t s, bool per_thread) {
  return (per_thread && s == nullptr) ? CU_STREAM_PER_THREAD : reinterpret_cast<CUstream>(s);
}

bool is_default_stream(CUstream s) {
  return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

cudaError_t malloc_async(void** ptr, size_t size, cudaStream_t stream, bool per_thread) {
  HookScope scope;
  const auto real_fn = per_thread ? real::cudaMallocAsync_ptsz() : real::cudaMallocAsync();
  Router* router = routable(scope);
  if (router == nullptr || ptr == nullptr || size == 0) {
    count_unrouted_alloc(scope);
    return real_fn(ptr, size, stream);
  }
  const CUstream s = driver_stream(stream, per_thread);
  int device = -1;
  // cudaMallocAsync allocates on the stream's device; a default stream is the current one's.
  if (is_default_stream(s)) {
    if (real::cudaGetDevice()(&device) != cudaSuccess) return real_fn(ptr, size, stream);
  } else if ((device = router->stream_device(s)) < 0) {
    return real_fn(ptr, size, stream);  // not a valid stream: the real call reports it
  }
  cudaError_t result = cudaSuccess;
  CUdeviceptr p = 0;
  if (router->allocate_async(device, size, s, &p, [&](size_t n, CUdeviceptr* native) {
        return served(result = real_fn(ptr, n, stream), ptr, native);
      })) {
    *ptr = reinterpret_cast<void*>(p);
  }
  // Pooled or served by the real function (observe mode, pass-through): the exit handler.
  if (result == cudaSuccess) poolshim::shim::note_device_allocation();
  return result;
}

cudaError_t free_async(void* ptr, cudaStream_t stream, bool per_thread) {
  HookScope scope;
  const auto real_fn = per_thread ? real::cudaFreeAsync_ptsz() : real::cudaFreeAsync();
  Router* router = routable_free(scope);
  if (router == nullptr || ptr == nullptr) return real_fn(ptr, stream);
  cudaError_t result = cudaSuccess;
  auto call_real = [&](void* p) { return classify(result = real_fn(p, stream)); };
  if (captures_active()) {
    router->free_unrouted(ptr, router->current_device(), call_real, true,
                          driver_stream(stream, per_thread));
  } else {
    router->free_async(ptr, driver_stream(stream, per_thread), call_real);
  }
  return result;
}

cudaStream_t capture_key(cudaStream_t stream, bool per_thread) {
  return (per_thread && stream == nullptr) ? cudaStreamPerThread : stream;
}

}  // namespace

POOLSHIM_EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
  HookScope scope;
  Router* router = routable(scope);
  if (router == nullptr || devPtr == nullptr || size == 0) {
    count_unrouted_alloc(scope);
    return real::cudaMalloc()(devPtr, size);
  }
  int device = 0;
  if (real::cudaGetDevice()(&device) != cudaSuccess) return real::cudaMalloc()(devPtr, size);
  cudaError_t result = cudaSuccess;
  CUdeviceptr p = 0;
  if (router->allocate_sync(device, size, &p, [&](size_t n, CUdeviceptr* native) {
        return served(result = real::cudaMalloc()(devPtr, n), devPtr, native);
      })) {
    *devPtr = reinterpret_cast<void*>(p);
  }
  // Pooled or served by the real function (observe mode, pass-through): the exit handler.
  if (result == cudaSuccess) poolshim::shim::note_device_allocation();
  return result;
}

POOLSHIM_EXPORT cudaError_t cudaFree(void* devPtr) {
  // cudaFree(nullptr) keeps its native meaning: initialise the context, free nothing. It is
  // no device-memory call: it does not start the core (nor create the log).
  if (devPtr == nullptr) return real::cudaFree()(devPtr);
  HookScope scope;
  Router* router = routable_free(scope);
  if (router == nullptr) return real::cudaFree()(devPtr);
  cudaError_t result = cudaSuccess;
  auto call_real = [&](void* p) { return classify(result = real::cudaFree()(p)); };
  if (captures_active()) {
    // During a capture the real function decides: it refuses the free where the capture
    // rules forbid it, and otherwise frees without the device-wide synchronization that would
    // invalidate the capture (seen on an H200: our synchronize-then-free did invalidate it).
    router->free_unrouted(devPtr, router->current_device(), call_real);
  } else {
    router->free_sync(devPtr, router->current_device(), call_real);
  }
  return result;
}

POOLSHIM_EXPORT cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  return malloc_async(devPtr, size, hStream, false);
}

POOLSHIM_EXPORT cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream) {
  return malloc_async(devPtr, size, hStream, true);
}

POOLSHIM_EXPORT cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  return free_async(devPtr, hStream, false);
}

POOLSHIM_EXPORT cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream) {
  return free_async(devPtr, hStream, true);
}

// Memory the pool holds but has not handed out is free for the application's purposes: the
// next allocation can use it.
POOLSHIM_EXPORT cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  HookScope scope;
  const cudaError_t result = real::cudaMemGetInfo()(free, total);
  Router* router = scope.outermost() ? poolshim::shim::router_if_running() : nullptr;
  if (result != cudaSuccess || router == nullptr || free == nullptr || total == nullptr)
    return result;
  router->adjust_memory_info(router->current_device(), free, total);
  return result;
}

POOLSHIM_EXPORT cudaError_t cudaDeviceReset() {
  HookScope scope;
  Router* router = scope.outermost() ? poolshim::shim::router_if_running() : nullptr;
  int device = -1;
  if (router != nullptr && real::cudaGetDevice()(&device) == cudaSuccess) {
    router->before_device_reset(device);
  }
  return real::cudaDeviceReset()();
}

POOLSHIM_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool) {
  HookScope scope;
  const cudaError_t result = real::cudaDeviceSetMemPool()(device, memPool);
  Router* router = scope.outermost() ? router_for_call() : nullptr;
  if (result == cudaSuccess && router != nullptr) {
    cudaMemPool_t default_pool = nullptr;
    const bool known = real::cudaDeviceGetDefaultMemPool()(&default_pool, device) == cudaSuccess;
    router->set_app_pool(device, !known || memPool != default_pool);
  }
  return result;
}

// Stream capture (DESIGN §3): while one is in progress, allocation calls pass through, so the
// capture sees exactly what it would see without the shim. Noted before the real begin, so
// that no call of another thread slips in between; undone if the begin fails.
namespace {

template <typename Begin>
cudaError_t begin_capture(Begin&& begin, cudaStream_t key) {
  HookScope scope;
  const bool track = scope.outermost() && poolshim::shim::bookkeeping_allowed();
  if (track) poolshim::shim::capture_began(key);
  const cudaError_t result = begin();
  if (track && result != cudaSuccess) poolshim::shim::capture_ended(key);
  return result;
}

// A capture ends with EndCapture whatever it returns (an invalidated capture ends too).
template <typename End>
cudaError_t end_capture(End&& end, cudaStream_t key) {
  HookScope scope;
  const cudaError_t result = end();
  if (scope.outermost() && poolshim::shim::bookkeeping_allowed())
    poolshim::shim::capture_ended(key);
  return result;
}

}  // namespace

POOLSHIM_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream,
                                                   enum cudaStreamCaptureMode mode) {
  return begin_capture([&] { return real::cudaStreamBeginCapture()(stream, mode); },
                       capture_key(stream, false));
}

POOLSHIM_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                                        enum cudaStreamCaptureMode mode) {
  return begin_capture([&] { return real::cudaStreamBeginCapture_ptsz()(stream, mode); },
                       capture_key(stream, true));
}

POOLSHIM_EXPORT cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                          const cudaGraphNode_t* dependencies,
                                                          const cudaGraphEdgeData* dependencyData,
                                                          size_t numDependencies,
                                                          enum cudaStreamCaptureMode mode) {
  return begin_capture(
      [&] {
        return real::cudaStreamBeginCaptureToGraph()(stream, graph, dependencies, dependencyData,
                                                     numDependencies, mode);
      },
      capture_key(stream, false));
}

POOLSHIM_EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(
    cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t* dependencies,
    const cudaGraphEdgeData* dependencyData, size_t numDependencies,
    enum cudaStreamCaptureMode mode) {
  return begin_capture(
      [&] {
        return real::cudaStreamBeginCaptureToGraph_ptsz()(stream, graph, dependencies,
                                                          dependencyData, numDependencies, mode);
      },
      capture_key(stream, true));
}

POOLSHIM_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  return end_capture([&] { return real::cudaStreamEndCapture()(stream, pGraph); },
                     capture_key(stream, false));
}

POOLSHIM_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* pGraph) {
  return end_capture([&] { return real::cudaStreamEndCapture_ptsz()(stream, pGraph); },
                     capture_key(stream, true));
}

// Peer access (DESIGN §3): the peer's pool must open to the device that now reaches it.
POOLSHIM_EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  HookScope scope;
  const cudaError_t result = real::cudaDeviceEnablePeerAccess()(peerDevice, flags);
  Router* router = scope.outermost() ? poolshim::shim::router_if_running() : nullptr;
  int device = -1;
  if (result == cudaSuccess && poolshim::shim::bookkeeping_allowed() &&
      real::cudaGetDevice()(&device) == cudaSuccess) {
    poolshim::shim::note_peer_access(device, peerDevice, router);
  }
  return result;
}
