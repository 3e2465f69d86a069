// Driver-API hooks (DESIGN §2): where programs built with the static runtime, NCCL, JAX, numba
// and CuPy's driver paths allocate. Reached three ways: direct symbol interposition (these
// exported names), the dlsym hook (a hooked name looked up in libcuda.so.1 answers with the
// hook), and the cuGetProcAddress hooks (the real function picks the variant for the caller's
// version and flags; the hook of exactly that variant is handed back, or the real pointer
// when that variant is not hooked). Every allocation is counted once: a driver hook reached
// from inside another hook (the real runtime function behind a runtime hook) passes through.
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "per_thread_watch.h"
#include "real_driver.h"
#include "router.h"
#include "shim.h"

// cuda.h maps these names to their newest variants with macros; the shim exports (and so
// defines) the older variants under their own names too, because a caller asking
// cuGetProcAddress for an older version gets those.
#undef cuStreamDestroy
#undef cuDevicePrimaryCtxReset
#undef cuGetProcAddress
#undef cuIpcOpenMemHandle

extern "C" {
CUresult cuStreamDestroy(CUstream hStream);
CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                        unsigned int flags, CUdevice dev);
decltype(cuMemAllocAsync) cuMemAllocAsync_ptsz;
decltype(cuMemFreeAsync) cuMemFreeAsync_ptsz;
decltype(cuMemAllocFromPoolAsync) cuMemAllocFromPoolAsync_ptsz;
decltype(cuStreamBeginCapture_v2) cuStreamBeginCapture_v2_ptsz;
decltype(cuStreamBeginCaptureToGraph) cuStreamBeginCaptureToGraph_ptsz;
decltype(cuStreamEndCapture) cuStreamEndCapture_ptsz;

// The instrumented half of the exported dlsym (its entry is shim/dlsym_entry.cpp).
__attribute__((visibility("hidden"))) void* poolshim_dlsym_hook(void* handle, const char* name);
}

using poolshim::RealResult;
using poolshim::Router;
using poolshim::shim::captures_active;
using poolshim::shim::HookScope;
using poolshim::shim::router_for_call;

namespace {

// X(exported name, type): every driver entry point the shim hooks.
#define POOLSHIM_DRIVER_HOOKS(X)                                               \
  X(cuMemAlloc_v2, decltype(::cuMemAlloc_v2))                                  \
  X(cuMemFree_v2, decltype(::cuMemFree_v2))                                    \
  X(cuMemGetInfo_v2, decltype(::cuMemGetInfo_v2))                              \
  X(cuMemAllocAsync, decltype(::cuMemAllocAsync))                              \
  X(cuMemAllocAsync_ptsz, decltype(::cuMemAllocAsync))                         \
  X(cuMemFreeAsync, decltype(::cuMemFreeAsync))                                \
  X(cuMemFreeAsync_ptsz, decltype(::cuMemFreeAsync))                           \
  X(cuMemAllocFromPoolAsync, decltype(::cuMemAllocFromPoolAsync))              \
  X(cuMemAllocFromPoolAsync_ptsz, decltype(::cuMemAllocFromPoolAsync))         \
  X(cuDeviceSetMemPool, decltype(::cuDeviceSetMemPool))                        \
  X(cuDevicePrimaryCtxReset, decltype(::cuDevicePrimaryCtxReset_v2))           \
  X(cuDevicePrimaryCtxReset_v2, decltype(::cuDevicePrimaryCtxReset_v2))        \
  X(cuStreamCreate, decltype(::cuStreamCreate))                                \
  X(cuStreamCreateWithPriority, decltype(::cuStreamCreateWithPriority))        \
  X(cuStreamDestroy, decltype(::cuStreamDestroy_v2))                           \
  X(cuStreamDestroy_v2, decltype(::cuStreamDestroy_v2))                        \
  X(cuStreamBeginCapture_v2, decltype(::cuStreamBeginCapture_v2))              \
  X(cuStreamBeginCapture_v2_ptsz, decltype(::cuStreamBeginCapture_v2))         \
  X(cuStreamBeginCaptureToGraph, decltype(::cuStreamBeginCaptureToGraph))      \
  X(cuStreamBeginCaptureToGraph_ptsz, decltype(::cuStreamBeginCaptureToGraph)) \
  X(cuStreamEndCapture, decltype(::cuStreamEndCapture))                        \
  X(cuStreamEndCapture_ptsz, decltype(::cuStreamEndCapture))                   \
  X(cuCtxCreate_v2, decltype(::cuCtxCreate_v2))                                \
  X(cuCtxCreate_v3, decltype(::cuCtxCreate_v3))                                \
  X(cuCtxCreate_v4, decltype(::cuCtxCreate_v4))                                \
  X(cuGreenCtxCreate, decltype(::cuGreenCtxCreate))                            \
  X(cuCtxEnablePeerAccess, decltype(::cuCtxEnablePeerAccess))                  \
  X(cuIpcGetMemHandle, decltype(::cuIpcGetMemHandle))                          \
  X(cuIpcOpenMemHandle, decltype(::cuIpcOpenMemHandle_v2))                     \
  X(cuIpcOpenMemHandle_v2, decltype(::cuIpcOpenMemHandle_v2))                  \
  X(cuIpcCloseMemHandle, decltype(::cuIpcCloseMemHandle))                      \
  X(cuMemCreate, decltype(::cuMemCreate))                                      \
  X(cuMemRelease, decltype(::cuMemRelease))                                    \
  X(cuMemMap, decltype(::cuMemMap))                                            \
  X(cuMemUnmap, decltype(::cuMemUnmap))                                        \
  X(cuGetProcAddress, decltype(::cuGetProcAddress))                            \
  X(cuGetProcAddress_v2, decltype(::cuGetProcAddress_v2))

enum class Hook : int {
#define POOLSHIM_HOOK_ENUM(name, type) name,
  POOLSHIM_DRIVER_HOOKS(POOLSHIM_HOOK_ENUM)
#undef POOLSHIM_HOOK_ENUM
      count
};
constexpr int kHooks = static_cast<int>(Hook::count);

const char* const kHookNames[] = {
#define POOLSHIM_HOOK_NAME(name, type) #name,
    POOLSHIM_DRIVER_HOOKS(POOLSHIM_HOOK_NAME)
#undef POOLSHIM_HOOK_NAME
};

// Our own hook of each (with -Bsymbolic-functions, &name is this library's definition).
void* hook_address(int i) {
  static void* const addresses[] = {
#define POOLSHIM_HOOK_ADDRESS(name, type) reinterpret_cast<void*>(&::name),
      POOLSHIM_DRIVER_HOOKS(POOLSHIM_HOOK_ADDRESS)
#undef POOLSHIM_HOOK_ADDRESS
  };
  return addresses[i];
}

std::atomic<void*> g_real[kHooks];

// libcuda.so.1's exported function `name`, resolved once. Null when the driver lacks it.
void* real_export(int i) {
  void* p = g_real[i].load(std::memory_order_acquire);
  if (p != nullptr) return p;
  void* library = poolshim::shim::driver_library();
  p = library != nullptr ? poolshim::shim::real_dlsym()(library, kHookNames[i]) : nullptr;
  if (p == hook_address(i)) p = nullptr;  // never hand a hook its own address as "real"
  if (p != nullptr) g_real[i].store(p, std::memory_order_release);
  return p;
}

// A driver without the entry point (too old): the call fails the way a missing one does.
template <typename F>
struct Missing;
template <typename... Args>
struct Missing<CUresult(Args...)> {
  static CUresult call(Args...) { return CUDA_ERROR_NOT_SUPPORTED; }
};

// real::cuMemAlloc_v2()(...) calls libcuda's cuMemAlloc_v2.
namespace real {
#define POOLSHIM_REAL_ACCESSOR(name, type)                                                      \
  inline std::add_pointer_t<type> name() {                                                      \
    void* p = real_export(static_cast<int>(Hook::name));                                        \
    return p != nullptr ? reinterpret_cast<std::add_pointer_t<type>>(p) : &Missing<type>::call; \
  }
POOLSHIM_DRIVER_HOOKS(POOLSHIM_REAL_ACCESSOR)
#undef POOLSHIM_REAL_ACCESSOR
}  // namespace real

int hook_index(const char* name) {
  for (int i = 0; i < kHooks; ++i) {
    if (std::strcmp(kHookNames[i], name) == 0) return i;
  }
  return -1;
}

// Stream creation is visible to the shim once a caller holds our stream hooks.
void note_handed_out(int i) {
  const auto hook = static_cast<Hook>(i);
  if (hook == Hook::cuStreamCreate || hook == Hook::cuStreamCreateWithPriority) {
    poolshim::shim::streams().mark_observed();
  }
}

// The hook for a real driver pointer, or the pointer itself when it is no hooked variant.
void* substitute(void* real_pointer) {
  for (int i = 0; i < kHooks; ++i) {
    if (real_export(i) == real_pointer) {
      note_handed_out(i);
      return hook_address(i);
    }
  }
  return real_pointer;
}

RealResult classify(CUresult r) {
  if (r == CUDA_SUCCESS) return RealResult::success;
  return r == CUDA_ERROR_OUT_OF_MEMORY ? RealResult::out_of_memory : RealResult::error;
}

// classify, and the address the real allocation wrote (0 when it failed), for the core's books.
RealResult served(CUresult r, const CUdeviceptr* out, CUdeviceptr* native) {
  *native = r == CUDA_SUCCESS ? *out : 0;
  return classify(r);
}

// The core when this call may be routed (as in the runtime hooks), counting the call.
Router* routable(const HookScope& scope) {
  if (!scope.outermost()) return nullptr;
  Router* router = router_for_call();
  if (router == nullptr) return nullptr;
  poolshim::shim::paths().driver_calls.add();
  return captures_active() ? nullptr : router;
}

void count_unrouted_alloc(const HookScope& scope) {
  if (!scope.outermost()) return;
  if (Router* router = router_for_call()) router->note_passthrough_alloc(router->current_device());
}

bool is_default_stream(CUstream s) {
  return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

// In the _ptsz variants, stream 0 is the calling thread's default stream.
CUstream per_thread(CUstream s, bool ptsz) {
  return (ptsz && s == nullptr) ? CU_STREAM_PER_THREAD : s;
}

template <typename Real>
CUresult mem_alloc_async(Real real_fn, CUdeviceptr* dptr, size_t bytes, CUstream stream,
                         bool ptsz) {
  HookScope scope;
  Router* router = routable(scope);
  if (router == nullptr || dptr == nullptr || bytes == 0) {
    count_unrouted_alloc(scope);
    return real_fn(dptr, bytes, stream);
  }
  const CUstream s = per_thread(stream, ptsz);
  const int device = is_default_stream(s) ? router->current_device() : router->stream_device(s);
  if (device < 0) return real_fn(dptr, bytes, stream);  // no context or a bad stream: native error
  CUresult result = CUDA_SUCCESS;
  CUdeviceptr p = 0;
  if (router->allocate_async(device, bytes, s, &p, [&](size_t n, CUdeviceptr* native) {
        return served(result = real_fn(dptr, n, stream), dptr, native);
      })) {
    *dptr = p;
  }
  // Pooled or served by the real function (observe mode, pass-through): the exit handler.
  if (result == CUDA_SUCCESS) poolshim::shim::note_device_allocation();
  return result;
}

template <typename Real>
CUresult mem_free_async(Real real_fn, CUdeviceptr dptr, CUstream stream, bool ptsz) {
  HookScope scope;
  Router* router = scope.outermost() ? router_for_call() : nullptr;
  if (router == nullptr || dptr == 0) return real_fn(dptr, stream);
  poolshim::shim::paths().driver_calls.add();
  CUresult result = CUDA_SUCCESS;
  auto call_real = [&](void* p) {
    return classify(result = real_fn(reinterpret_cast<CUdeviceptr>(p), stream));
  };
  void* ptr = reinterpret_cast<void*>(dptr);
  if (captures_active()) {
    router->free_unrouted(ptr, router->current_device(), call_real, true, per_thread(stream, ptsz));
  } else {
    router->free_async(ptr, per_thread(stream, ptsz), call_real);
  }
  return result;
}

template <typename Real>
CUresult alloc_from_app_pool(Real real_fn, CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                             CUstream stream, bool ptsz) {
  HookScope scope;
  if (scope.outermost()) {
    if (Router* router = router_for_call()) {
      const CUstream s = per_thread(stream, ptsz);
      router->note_app_pool_alloc(is_default_stream(s) ? router->current_device()
                                                       : router->stream_device(s));
    }
  }
  return real_fn(dptr, bytes, pool, stream);
}

template <typename Begin>
CUresult begin_capture(Begin&& begin, CUstream stream, bool ptsz) {
  HookScope scope;
  const bool track = scope.outermost() && poolshim::shim::bookkeeping_allowed();
  const auto key = reinterpret_cast<cudaStream_t>(per_thread(stream, ptsz));
  if (track) poolshim::shim::capture_began(key);  // before: no call slips in between
  const CUresult r = begin();
  if (track && r != CUDA_SUCCESS) poolshim::shim::capture_ended(key);
  return r;
}

CUresult end_capture(decltype(&::cuStreamEndCapture) real_fn, CUstream stream, CUgraph* graph,
                     bool ptsz) {
  HookScope scope;
  const CUresult r = real_fn(stream, graph);
  if (scope.outermost() && poolshim::shim::bookkeeping_allowed()) {
    poolshim::shim::capture_ended(reinterpret_cast<cudaStream_t>(per_thread(stream, ptsz)));
  }
  return r;
}

// A driver function the shim calls for its own bookkeeping (not hooked), resolved once.
template <typename F>
F* unhooked(const char* name, std::atomic<void*>& cache) {
  void* p = cache.load(std::memory_order_acquire);
  if (p == nullptr) {
    void* library = poolshim::shim::driver_library();
    p = library != nullptr ? poolshim::shim::real_dlsym()(library, name) : nullptr;
    cache.store(p, std::memory_order_release);
  }
  return reinterpret_cast<F*>(p);
}

void register_stream(CUresult r, const CUstream* stream, unsigned int flags) {
  if (!poolshim::shim::bookkeeping_allowed()) return;
  poolshim::shim::streams().mark_observed();
  if (r == CUDA_SUCCESS) poolshim::shim::note_stream_beyond_legacy();
  // Blocking streams need no entry: the legacy default stream orders them (DESIGN §3). Every
  // non-blocking one does, in both free modes: ordered frees and the cache's event fences wait
  // for each (a fence that missed one let a block freed on it serve another stream while a
  // kernel still wrote to it: seen on an H200 in sync mode).
  if (r != CUDA_SUCCESS || stream == nullptr || (flags & CU_STREAM_NON_BLOCKING) == 0) return;
  // Observe mode pools nothing, so no fence waits for the stream: no event of our own either.
  if (poolshim::shim::observe_mode()) return;
  static std::atomic<void*> get_device{nullptr};
  static std::atomic<void*> event_create{nullptr};
  auto* stream_get_device =
      unhooked<decltype(::cuStreamGetDevice)>("cuStreamGetDevice", get_device);
  auto* create_event = unhooked<decltype(::cuEventCreate)>("cuEventCreate", event_create);
  poolshim::StreamRegistry::Entry entry;
  entry.stream = *stream;
  CUdevice device = -1;
  if (stream_get_device == nullptr || stream_get_device(*stream, &device) != CUDA_SUCCESS) {
    // A stream the shim cannot place: ordered frees can no longer trust their list.
    poolshim::shim::streams().mark_foreign_context();
    return;
  }
  entry.device = static_cast<int>(device);
  // The event ordered frees record on this stream, made now in the stream's (current)
  // context; without one, frees of this device synchronize instead.
  if (create_event == nullptr ||
      create_event(&entry.event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    entry.event = nullptr;
  }
  poolshim::shim::streams().add(entry);
  // Listed first, then the core looks for legacy-barrier reuse (Router::after_stream_listed).
  if (Router* router = poolshim::shim::router_if_running()) router->after_stream_listed(entry);
}

}  // namespace

// ---- the exported hooks ------------------------------------------------------------------

POOLSHIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  HookScope scope;
  const auto real_fn = real::cuMemAlloc_v2();
  Router* router = routable(scope);
  if (router == nullptr || dptr == nullptr || bytesize == 0) {
    count_unrouted_alloc(scope);
    return real_fn(dptr, bytesize);
  }
  // The driver allocates in the current context; none current: the real call says so.
  const int device = router->current_device();
  if (device < 0) return real_fn(dptr, bytesize);
  CUresult result = CUDA_SUCCESS;
  CUdeviceptr p = 0;
  if (router->allocate_sync(device, bytesize, &p, [&](size_t n, CUdeviceptr* native) {
        return served(result = real_fn(dptr, n), dptr, native);
      })) {
    *dptr = p;
  }
  // Pooled or served by the real function (observe mode, pass-through): the exit handler.
  if (result == CUDA_SUCCESS) poolshim::shim::note_device_allocation();
  return result;
}

POOLSHIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  const auto real_fn = real::cuMemFree_v2();
  if (dptr == 0) return real_fn(dptr);  // cuMemFree(0): its native meaning, no core start
  HookScope scope;
  Router* router = scope.outermost() ? router_for_call() : nullptr;
  if (router == nullptr) return real_fn(dptr);
  poolshim::shim::paths().driver_calls.add();
  CUresult result = CUDA_SUCCESS;
  auto call_real = [&](void* p) {
    return classify(result = real_fn(reinterpret_cast<CUdeviceptr>(p)));
  };
  void* ptr = reinterpret_cast<void*>(dptr);
  if (captures_active()) {
    // During a capture the real function decides: it refuses the free where the capture
    // rules forbid it, and otherwise frees without the device-wide synchronization that would
    // invalidate the capture (seen on an H200: our synchronize-then-free did invalidate it).
    router->free_unrouted(ptr, router->current_device(), call_real);
  } else {
    router->free_sync(ptr, router->current_device(), call_real);
  }
  return result;
}

POOLSHIM_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  HookScope scope;
  const CUresult result = real::cuMemGetInfo_v2()(free, total);
  Router* router = scope.outermost() ? poolshim::shim::router_if_running() : nullptr;
  if (result != CUDA_SUCCESS || router == nullptr || free == nullptr || total == nullptr)
    return result;
  router->adjust_memory_info(router->current_device(), free, total);
  return result;
}

POOLSHIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return mem_alloc_async(real::cuMemAllocAsync(), dptr, bytesize, hStream, false);
}

POOLSHIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                              CUstream hStream) {
  return mem_alloc_async(real::cuMemAllocAsync_ptsz(), dptr, bytesize, hStream, true);
}

POOLSHIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  return mem_free_async(real::cuMemFreeAsync(), dptr, hStream, false);
}

POOLSHIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  return mem_free_async(real::cuMemFreeAsync_ptsz(), dptr, hStream, true);
}

POOLSHIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                                 CUmemoryPool pool, CUstream hStream) {
  return alloc_from_app_pool(real::cuMemAllocFromPoolAsync(), dptr, bytesize, pool, hStream, false);
}

POOLSHIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                      CUmemoryPool pool, CUstream hStream) {
  return alloc_from_app_pool(real::cuMemAllocFromPoolAsync_ptsz(), dptr, bytesize, pool, hStream,
                             true);
}

POOLSHIM_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  HookScope scope;
  const CUresult result = real::cuDeviceSetMemPool()(dev, pool);
  Router* router = scope.outermost() ? router_for_call() : nullptr;
  if (result == CUDA_SUCCESS && router != nullptr) {
    static std::atomic<void*> cache{nullptr};
    auto* get_default =
        unhooked<decltype(::cuDeviceGetDefaultMemPool)>("cuDeviceGetDefaultMemPool", cache);
    CUmemoryPool default_pool = nullptr;
    const bool known = get_default != nullptr && get_default(&default_pool, dev) == CUDA_SUCCESS;
    router->set_app_pool(static_cast<int>(dev), !known || pool != default_pool);
  }
  return result;
}

namespace {
CUresult reset_device(decltype(&::cuDevicePrimaryCtxReset_v2) real_fn, CUdevice dev) {
  HookScope scope;
  Router* router = scope.outermost() ? poolshim::shim::router_if_running() : nullptr;
  if (router != nullptr) router->before_device_reset(static_cast<int>(dev));
  return real_fn(dev);
}

CUresult destroy_stream(decltype(&::cuStreamDestroy_v2) real_fn, CUstream stream) {
  if (poolshim::shim::bookkeeping_allowed()) {
    Router* router = poolshim::shim::router_if_running();
    if (router != nullptr) router->before_any_stream_destroy(stream);
    poolshim::StreamRegistry::Entry entry;
    const bool listed = poolshim::shim::streams().remove(
        stream, &entry, [router](const poolshim::StreamRegistry::Entry& e) {
          if (router != nullptr) router->wait_for_stream_at_destroy(e);
        });
    if (listed && router != nullptr) {
      router->release_stream_event(entry);
    } else if (listed && entry.event != nullptr) {
      static std::atomic<void*> destroy{nullptr};
      auto* event_destroy = unhooked<decltype(::cuEventDestroy_v2)>("cuEventDestroy_v2", destroy);
      if (event_destroy != nullptr) event_destroy(entry.event);
    }
  }
  return real_fn(stream);
}
}  // namespace

POOLSHIM_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return reset_device(real::cuDevicePrimaryCtxReset(), dev);
}

POOLSHIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return reset_device(real::cuDevicePrimaryCtxReset_v2(), dev);
}

POOLSHIM_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  const CUresult r = real::cuStreamCreate()(phStream, Flags);
  register_stream(r, phStream, Flags);
  return r;
}

POOLSHIM_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags,
                                                    int priority) {
  const CUresult r = real::cuStreamCreateWithPriority()(phStream, flags, priority);
  register_stream(r, phStream, flags);
  return r;
}

POOLSHIM_EXPORT CUresult cuStreamDestroy(CUstream hStream) {
  return destroy_stream(real::cuStreamDestroy(), hStream);
}

POOLSHIM_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  return destroy_stream(real::cuStreamDestroy_v2(), hStream);
}

POOLSHIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return begin_capture([&] { return real::cuStreamBeginCapture_v2()(hStream, mode); }, hStream,
                       false);
}

POOLSHIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return begin_capture([&] { return real::cuStreamBeginCapture_v2_ptsz()(hStream, mode); }, hStream,
                       true);
}

POOLSHIM_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                     const CUgraphNode* dependencies,
                                                     const CUgraphEdgeData* dependencyData,
                                                     size_t numDependencies,
                                                     CUstreamCaptureMode mode) {
  return begin_capture(
      [&] {
        return real::cuStreamBeginCaptureToGraph()(hStream, hGraph, dependencies, dependencyData,
                                                   numDependencies, mode);
      },
      hStream, false);
}

POOLSHIM_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                          const CUgraphNode* dependencies,
                                                          const CUgraphEdgeData* dependencyData,
                                                          size_t numDependencies,
                                                          CUstreamCaptureMode mode) {
  return begin_capture(
      [&] {
        return real::cuStreamBeginCaptureToGraph_ptsz()(hStream, hGraph, dependencies,
                                                        dependencyData, numDependencies, mode);
      },
      hStream, true);
}

POOLSHIM_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return end_capture(real::cuStreamEndCapture(), hStream, phGraph, false);
}

POOLSHIM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return end_capture(real::cuStreamEndCapture_ptsz(), hStream, phGraph, true);
}

// A context of the application's own: its work is not covered by ordered frees.
POOLSHIM_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  const CUresult r = real::cuCtxCreate_v2()(pctx, flags, dev);
  if (r == CUDA_SUCCESS) poolshim::shim::streams().mark_foreign_context();
  return r;
}

POOLSHIM_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray,
                                        int numParams, unsigned int flags, CUdevice dev) {
  const CUresult r = real::cuCtxCreate_v3()(pctx, paramsArray, numParams, flags, dev);
  if (r == CUDA_SUCCESS) poolshim::shim::streams().mark_foreign_context();
  return r;
}

POOLSHIM_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* ctxCreateParams,
                                        unsigned int flags, CUdevice dev) {
  const CUresult r = real::cuCtxCreate_v4()(pctx, ctxCreateParams, flags, dev);
  if (r == CUDA_SUCCESS) poolshim::shim::streams().mark_foreign_context();
  return r;
}

// A green context's streams are not covered by ordered frees.
POOLSHIM_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev,
                                          unsigned int flags) {
  const CUresult r = real::cuGreenCtxCreate()(phCtx, desc, dev, flags);
  if (r == CUDA_SUCCESS && poolshim::shim::bookkeeping_allowed()) {
    poolshim::shim::streams().mark_foreign_context();
  }
  return r;
}

// Peer access (DESIGN §3): the peer's pool must open to the device that now reaches it.
POOLSHIM_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  HookScope scope;
  const CUresult r = real::cuCtxEnablePeerAccess()(peerContext, Flags);
  if (r != CUDA_SUCCESS || !scope.outermost() || !poolshim::shim::bookkeeping_allowed()) return r;
  static std::atomic<void*> get_device{nullptr};
  static std::atomic<void*> push{nullptr};
  static std::atomic<void*> pop{nullptr};
  auto* ctx_get_device = unhooked<decltype(::cuCtxGetDevice)>("cuCtxGetDevice", get_device);
  auto* ctx_push = unhooked<decltype(::cuCtxPushCurrent_v2)>("cuCtxPushCurrent_v2", push);
  auto* ctx_pop = unhooked<decltype(::cuCtxPopCurrent_v2)>("cuCtxPopCurrent_v2", pop);
  if (ctx_get_device == nullptr || ctx_push == nullptr || ctx_pop == nullptr) return r;
  CUdevice from = -1;
  CUdevice to = -1;
  if (ctx_get_device(&from) != CUDA_SUCCESS) return r;
  if (ctx_push(peerContext) == CUDA_SUCCESS) {
    if (ctx_get_device(&to) != CUDA_SUCCESS) to = -1;
    CUcontext popped = nullptr;
    ctx_pop(&popped);
  }
  if (to >= 0) {
    poolshim::shim::note_peer_access(static_cast<int>(from), static_cast<int>(to),
                                     poolshim::shim::router_if_running());
  }
  return r;
}

// Virtual-memory calls of the application (JAX's platform allocator, PyTorch's
// expandable_segments, NCCL): the real call, then its books (pool/vmm_ledger.h), never pooled.
// The pool's own calls go to the driver directly and never reach these.
namespace {

// The running core, for the books of a real call that succeeded (outermost calls only).
Router* books_after(CUresult r, const HookScope& scope) {
  return r == CUDA_SUCCESS && scope.outermost() ? poolshim::shim::router_if_running() : nullptr;
}

}  // namespace

POOLSHIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags) {
  HookScope scope;
  const CUresult r = real::cuMemCreate()(handle, size, prop, flags);
  Router* router = r == CUDA_SUCCESS && scope.outermost() ? router_for_call() : nullptr;
  if (router != nullptr && handle != nullptr) {
    router->note_vmm_create(*handle, size, prop);
    poolshim::shim::note_device_allocation();
  }
  return r;
}

POOLSHIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  HookScope scope;
  const CUresult r = real::cuMemRelease()(handle);
  if (Router* router = books_after(r, scope)) router->vmm().record_release(handle);
  return r;
}

POOLSHIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                  CUmemGenericAllocationHandle handle, unsigned long long flags) {
  HookScope scope;
  const CUresult r = real::cuMemMap()(ptr, size, offset, handle, flags);
  if (Router* router = books_after(r, scope)) router->vmm().record_map(ptr, size, handle);
  return r;
}

POOLSHIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  HookScope scope;
  const CUresult r = real::cuMemUnmap()(ptr, size);
  if (Router* router = books_after(r, scope)) router->vmm().record_unmap(ptr, size);
  return r;
}

// Legacy IPC (DESIGN §10): a pooled block of a paged arena is exported as poolshim's own
// handle (ipc_share.h); anything else, and every failure, goes to the real function. The
// runtime's cudaIpc* functions reach these hooks through cuGetProcAddress, shared or static.
POOLSHIM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  HookScope scope;
  Router* router = scope.outermost() ? poolshim::shim::router_if_running() : nullptr;
  if (router != nullptr && pHandle != nullptr && router->ipc_export(dptr, pHandle->reserved)) {
    return CUDA_SUCCESS;
  }
  const CUresult r = real::cuIpcGetMemHandle()(pHandle, dptr);
  if (r != CUDA_SUCCESS && router != nullptr)
    router->note_ipc_failure(reinterpret_cast<void*>(dptr));
  return r;
}

namespace {

template <typename Real>
CUresult open_ipc(Real real_fn, CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  HookScope scope;
  Router* router =
      scope.outermost() && poolshim::IpcShare::ours(handle.reserved) ? router_for_call() : nullptr;
  if (router == nullptr || pdptr == nullptr ||
      (flags & ~static_cast<unsigned int>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0) {
    return real_fn(pdptr, handle, flags);
  }
  poolshim::shim::paths().driver_calls.add();
  return router->ipc_open(handle.reserved, pdptr);
}

}  // namespace

POOLSHIM_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                            unsigned int Flags) {
  return open_ipc(real::cuIpcOpenMemHandle(), pdptr, handle, Flags);
}

POOLSHIM_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                               unsigned int Flags) {
  return open_ipc(real::cuIpcOpenMemHandle_v2(), pdptr, handle, Flags);
}

POOLSHIM_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  HookScope scope;
  Router* router = scope.outermost() ? poolshim::shim::router_if_running() : nullptr;
  CUresult result = CUDA_SUCCESS;
  if (router != nullptr && router->ipc_close(dptr, &result)) return result;
  return real::cuIpcCloseMemHandle()(dptr);
}

// The runtime finds the driver's entry points through cuGetProcAddress (it even looks the
// function up through itself: the hook then returns itself). The real function chooses the
// variant for the caller's version and flags; the hook hands back our hook of that variant.
// A stream function we do not hook is handed back as a watching thunk (per_thread_watch.h):
// CUDA 13's runtime looks the per-thread variants up in every program, so only a call shows the
// per-thread default stream in use. `legacy_lookup` answers the same query for the legacy
// stream: where a per-thread query gets the same function, it has no per-thread form.
template <class LegacyLookup>
CUresult answer_proc_address(CUresult r, const char* symbol, void** pfn, cuuint64_t flags,
                             LegacyLookup legacy_lookup) {
  if (r != CUDA_SUCCESS || pfn == nullptr || *pfn == nullptr) return r;
  void* const real = *pfn;
  void* answer = substitute(real);
  if (answer != real) {
    poolshim::shim::paths().proc_address_answers.add();
    *pfn = answer;
    return r;
  }
  void* legacy = nullptr;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 &&
                          (legacy_lookup(&legacy) != CUDA_SUCCESS || legacy != real);
  poolshim::shim::Watch w{poolshim::shim::Watch::exhausted, real};
  if (per_thread) {
    if (void* thunk = poolshim::shim::per_thread_watch(symbol, real))
      w = {poolshim::shim::Watch::watched, thunk};
  } else {
    w = poolshim::shim::legacy_stream_watch(symbol, real);
  }
  if (w.status == poolshim::shim::Watch::exhausted) {
    poolshim::shim::note_stream_beyond_legacy();  // no thunk left: assume the stream is used
  } else if (w.status == poolshim::shim::Watch::watched) {
    poolshim::shim::paths().per_thread_watches.add();
    *pfn = w.answer;
  }
  return r;
}

constexpr cuuint64_t legacy_flags(cuuint64_t flags) {
  return (flags & ~cuuint64_t{CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM}) |
         CU_GET_PROC_ADDRESS_LEGACY_STREAM;
}

POOLSHIM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                             cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* symbolStatus) {
  const auto real_fn = real::cuGetProcAddress_v2();
  return answer_proc_address(real_fn(symbol, pfn, cudaVersion, flags, symbolStatus), symbol, pfn,
                             flags, [&](void** legacy) {
                               CUdriverProcAddressQueryResult status{};
                               return real_fn(symbol, legacy, cudaVersion, legacy_flags(flags),
                                              &status);
                             });
}

POOLSHIM_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                          cuuint64_t flags) {
  const auto real_fn = real::cuGetProcAddress();
  return answer_proc_address(
      real_fn(symbol, pfn, cudaVersion, flags), symbol, pfn, flags,
      [&](void** legacy) { return real_fn(symbol, legacy, cudaVersion, legacy_flags(flags)); });
}

// ---- dlsym ---------------------------------------------------------------------------------

namespace poolshim::shim {

void* driver_library() {
  static std::atomic<void*> handle{nullptr};
  void* h = handle.load(std::memory_order_acquire);
  if (h == nullptr) {
    h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) handle.store(h, std::memory_order_release);
  }
  return h;
}

}  // namespace poolshim::shim

// A watched stream function looked up by name in libcuda: its thunk (per_thread_watch.h), or
// null (the real dlsym answers) for any other name or where the handle's answer is not
// libcuda's; where no thunk can stand for libcuda's function, the process is marked at once.
void* watched_by_name(void* handle, const char* name) {
  if (!poolshim::shim::watched_name(name)) return nullptr;
  void* answer = poolshim::shim::real_dlsym()(handle, name);
  if (answer == nullptr) return nullptr;
  void* library = poolshim::shim::driver_library();
  if (library == nullptr || answer != poolshim::shim::real_dlsym()(library, name)) return nullptr;
  const poolshim::shim::Watch w = poolshim::shim::watch_by_name(name, answer);
  if (w.status == poolshim::shim::Watch::exhausted) poolshim::shim::note_stream_beyond_legacy();
  if (w.status != poolshim::shim::Watch::watched) return nullptr;
  poolshim::shim::paths().dlsym_answers.add();
  return w.answer;
}

// dlsym(handle, "cu...") with a real handle (dlsym_entry.cpp has ruled out the rest): our hook
// when `name` is a hooked driver entry point and the handle's answer is libcuda's own function,
// else null (the trampoline then jumps to the real dlsym).
void* poolshim_dlsym_hook(void* handle, const char* name) {
  const int i = hook_index(name);
  if (i < 0) return watched_by_name(handle, name);
  void* answer = poolshim::shim::real_dlsym()(handle, name);
  if (answer == nullptr || answer != real_export(i)) return nullptr;
  poolshim::shim::paths().dlsym_answers.add();
  note_handed_out(i);
  return hook_address(i);
}
