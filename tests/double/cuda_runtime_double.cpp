// CPU test double of the CUDA runtime, built as libcudart.so.13.
//
// A thin runtime over whatever libcuda.so.1 the loader finds (normally the driver double). It
// reaches the driver exactly the way the CUDA 13 runtime does, because that path is what the
// shim intercepts: dlopen("libcuda.so.1"), dlsym(handle, "cuGetProcAddress_v2"), a look-up of
// "cuGetProcAddress" through that pointer, then every driver function through the pointer it
// returned, once with the default flags and, for stream functions, once with the per-thread
// default stream flag for the _ptsz/_ptds entry points. No driver symbol is referenced directly.

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#define CUDART_DOUBLE_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kRuntimeVersion = 13000;
constexpr int kMaxDevices = 8;
// Per-thread default stream forms of driver functions exist from CUDA 7.0 on.
constexpr int kPerThreadFormsSince = 7000;

// Driver functions looked up with the default flags only: member, base name, version, prototype.
#define CUDART_DOUBLE_DRIVER_FUNCTIONS(X)                                                      \
  X(init, "cuInit", 2000, cuInit)                                                              \
  X(driverGetVersion, "cuDriverGetVersion", 2020, cuDriverGetVersion)                          \
  X(deviceGetCount, "cuDeviceGetCount", 2000, cuDeviceGetCount)                                \
  X(deviceGetAttribute, "cuDeviceGetAttribute", 2000, cuDeviceGetAttribute)                    \
  X(devicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain)        \
  X(devicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState)  \
  X(devicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2) \
  X(devicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2)       \
  X(ctxGetCurrent, "cuCtxGetCurrent", 4000, cuCtxGetCurrent)                                   \
  X(ctxSetCurrent, "cuCtxSetCurrent", 4000, cuCtxSetCurrent)                                   \
  X(ctxSynchronize, "cuCtxSynchronize", 2000, cuCtxSynchronize)                                \
  X(memGetInfo, "cuMemGetInfo", 3020, cuMemGetInfo_v2)                                         \
  X(memAlloc, "cuMemAlloc", 3020, cuMemAlloc_v2)                                               \
  X(memFree, "cuMemFree", 3020, cuMemFree_v2)                                                  \
  X(memAllocHost, "cuMemAllocHost", 3020, cuMemAllocHost_v2)                                   \
  X(memFreeHost, "cuMemFreeHost", 2000, cuMemFreeHost)                                         \
  X(streamCreate, "cuStreamCreate", 2000, cuStreamCreate)                                      \
  X(streamDestroy, "cuStreamDestroy", 4000, cuStreamDestroy_v2)                                \
  X(threadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", 10010,               \
    cuThreadExchangeStreamCaptureMode)                                                         \
  X(graphDestroy, "cuGraphDestroy", 10000, cuGraphDestroy)                                     \
  X(eventCreate, "cuEventCreate", 2000, cuEventCreate)                                         \
  X(eventSynchronize, "cuEventSynchronize", 2000, cuEventSynchronize)                          \
  X(eventDestroy, "cuEventDestroy", 4000, cuEventDestroy_v2)                                   \
  X(ipcGetMemHandle, "cuIpcGetMemHandle", 4010, cuIpcGetMemHandle)                             \
  X(ipcOpenMemHandle, "cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2)                      \
  X(ipcCloseMemHandle, "cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle)                       \
  X(deviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool)    \
  X(deviceGetMemPool, "cuDeviceGetMemPool", 11020, cuDeviceGetMemPool)                         \
  X(deviceSetMemPool, "cuDeviceSetMemPool", 11020, cuDeviceSetMemPool)                         \
  X(memPoolCreate, "cuMemPoolCreate", 11020, cuMemPoolCreate)                                  \
  X(memPoolDestroy, "cuMemPoolDestroy", 11020, cuMemPoolDestroy)                               \
  X(memPoolSetAttribute, "cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute)                \
  X(memPoolGetAttribute, "cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute)                \
  X(memPoolTrimTo, "cuMemPoolTrimTo", 11020, cuMemPoolTrimTo)                                  \
  X(pointerGetAttribute, "cuPointerGetAttribute", 4000, cuPointerGetAttribute)

// Driver functions with a per-thread default stream form, looked up a second time with
// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM into `<member>PerThread`.
#define CUDART_DOUBLE_PER_THREAD_DRIVER_FUNCTIONS(X)                            \
  X(memcpy, "cuMemcpy", 4000, cuMemcpy)                                         \
  X(memcpyHtoD, "cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2)                          \
  X(memcpyDtoH, "cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2)                          \
  X(memcpyDtoD, "cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2)                          \
  X(memsetD8, "cuMemsetD8", 3020, cuMemsetD8_v2)                                \
  X(memcpyAsync, "cuMemcpyAsync", 4000, cuMemcpyAsync)                          \
  X(memcpyHtoDAsync, "cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2)           \
  X(memcpyDtoHAsync, "cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2)           \
  X(memcpyDtoDAsync, "cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2)           \
  X(memsetD8Async, "cuMemsetD8Async", 3020, cuMemsetD8Async)                    \
  X(streamSynchronize, "cuStreamSynchronize", 2000, cuStreamSynchronize)        \
  X(streamQuery, "cuStreamQuery", 2000, cuStreamQuery)                          \
  X(streamWaitEvent, "cuStreamWaitEvent", 3020, cuStreamWaitEvent)              \
  X(eventRecord, "cuEventRecord", 2000, cuEventRecord)                          \
  X(streamBeginCapture, "cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2) \
  X(streamEndCapture, "cuStreamEndCapture", 10000, cuStreamEndCapture)          \
  X(streamIsCapturing, "cuStreamIsCapturing", 10000, cuStreamIsCapturing)       \
  X(memAllocAsync, "cuMemAllocAsync", 11020, cuMemAllocAsync)                   \
  X(memFreeAsync, "cuMemFreeAsync", 11020, cuMemFreeAsync)                      \
  X(memAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync)

// The resolved driver. Signatures come from cuda.h, so a wrong prototype does not compile.
struct DriverApi {
  decltype(&::cuGetProcAddress_v2) getProcAddress = nullptr;
#define CUDART_DOUBLE_MEMBER(member, symbol, version, prototype) \
  decltype(&::prototype) member = nullptr;
#define CUDART_DOUBLE_PER_THREAD_MEMBER(member, symbol, version, prototype) \
  decltype(&::prototype) member = nullptr;                                  \
  decltype(&::prototype) member##PerThread = nullptr;
  CUDART_DOUBLE_DRIVER_FUNCTIONS(CUDART_DOUBLE_MEMBER)
  CUDART_DOUBLE_PER_THREAD_DRIVER_FUNCTIONS(CUDART_DOUBLE_PER_THREAD_MEMBER)
#undef CUDART_DOUBLE_MEMBER
#undef CUDART_DOUBLE_PER_THREAD_MEMBER
};

// The slot is written through void** like any dlsym-style look-up.
template <class Function>
void** slot(Function* function) {
  return reinterpret_cast<void**>(function);
}

bool lookUp(const DriverApi& api, const char* symbol, int version, cuuint64_t flags, void** out) {
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return api.getProcAddress(symbol, out, version, flags, &status) == CUDA_SUCCESS &&
         status == CU_GET_PROC_ADDRESS_SUCCESS && *out != nullptr;
}

cudaError_t loadDriver(DriverApi& api) {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return cudaErrorInsufficientDriver;
  auto bootstrap =
      reinterpret_cast<decltype(&::cuGetProcAddress_v2)>(dlsym(handle, "cuGetProcAddress_v2"));
  if (bootstrap == nullptr) return cudaErrorInsufficientDriver;
  // The runtime uses the cuGetProcAddress that cuGetProcAddress itself returns, not the dlsym
  // result, so a hook installed through dlsym must answer this look-up too. The CUDA 13 runtime
  // first asks for the CUDA 11.3 form as well (seen by tracing it), so a hook must answer that
  // one; the double asks for it and, like the real runtime, uses the 12.0 form.
  api.getProcAddress = bootstrap;
  void* legacy_form = nullptr;
  lookUp(api, "cuGetProcAddress", 11030, CU_GET_PROC_ADDRESS_DEFAULT, &legacy_form);
  if (!lookUp(api, "cuGetProcAddress", 12000, CU_GET_PROC_ADDRESS_DEFAULT,
              slot(&api.getProcAddress))) {
    return cudaErrorInsufficientDriver;
  }
  bool complete = true;
#define CUDART_DOUBLE_LOOK_UP(member, symbol, version, prototype) \
  complete =                                                      \
      lookUp(api, symbol, version, CU_GET_PROC_ADDRESS_DEFAULT, slot(&api.member)) && complete;
#define CUDART_DOUBLE_LOOK_UP_PER_THREAD(member, symbol, version, prototype)                 \
  CUDART_DOUBLE_LOOK_UP(member, symbol, version, prototype)                                  \
  complete =                                                                                 \
      lookUp(api, symbol, version < kPerThreadFormsSince ? kPerThreadFormsSince : version,   \
             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, slot(&api.member##PerThread)) && \
      complete;
  CUDART_DOUBLE_DRIVER_FUNCTIONS(CUDART_DOUBLE_LOOK_UP)
  CUDART_DOUBLE_PER_THREAD_DRIVER_FUNCTIONS(CUDART_DOUBLE_LOOK_UP_PER_THREAD)
#undef CUDART_DOUBLE_LOOK_UP
#undef CUDART_DOUBLE_LOOK_UP_PER_THREAD
  if (!complete) return cudaErrorInsufficientDriver;

  int version = 0;
  if (api.driverGetVersion(&version) != CUDA_SUCCESS || version < kRuntimeVersion) {
    return cudaErrorInsufficientDriver;
  }
  const CUresult init = api.init(0);
  if (init == CUDA_ERROR_NO_DEVICE) return cudaErrorNoDevice;
  if (init != CUDA_SUCCESS) return cudaErrorInitializationError;
  return cudaSuccess;
}

// The entry points cast runtime enums to driver enums; that is only right while they share values.
static_assert(static_cast<int>(cudaMemPoolReuseFollowEventDependencies) ==
              static_cast<int>(CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES));
static_assert(static_cast<int>(cudaMemPoolAttrReleaseThreshold) ==
              static_cast<int>(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD));
static_assert(static_cast<int>(cudaMemPoolAttrUsedMemHigh) ==
              static_cast<int>(CU_MEMPOOL_ATTR_USED_MEM_HIGH));
static_assert(static_cast<int>(cudaStreamCaptureModeRelaxed) ==
              static_cast<int>(CU_STREAM_CAPTURE_MODE_RELAXED));
static_assert(static_cast<int>(cudaStreamCaptureModeThreadLocal) ==
              static_cast<int>(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
static_assert(static_cast<int>(cudaStreamCaptureStatusInvalidated) ==
              static_cast<int>(CU_STREAM_CAPTURE_STATUS_INVALIDATED));
static_assert(static_cast<int>(cudaDevAttrMemoryPoolsSupported) ==
              static_cast<int>(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED));
static_assert(static_cast<int>(cudaDevAttrComputeCapabilityMajor) ==
              static_cast<int>(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR));
static_assert(static_cast<int>(cudaMemLocationTypeDevice) ==
              static_cast<int>(CU_MEM_LOCATION_TYPE_DEVICE));
static_assert(static_cast<int>(cudaMemAllocationTypePinned) ==
              static_cast<int>(CU_MEM_ALLOCATION_TYPE_PINNED));
static_assert(cudaStreamNonBlocking == CU_STREAM_NON_BLOCKING);

// ---- errors ---------------------------------------------------------------------------------

cudaError_t toRuntimeError(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS:
      return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE:
      return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED:
      return cudaErrorInitializationError;
    case CUDA_ERROR_DEINITIALIZED:
      return cudaErrorCudartUnloading;
    case CUDA_ERROR_NO_DEVICE:
      return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE:
      return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_CONTEXT:
      return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_INVALID_HANDLE:
      return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_ILLEGAL_STATE:
      return cudaErrorIllegalState;
    case CUDA_ERROR_NOT_FOUND:
      return cudaErrorSymbolNotFound;
    case CUDA_ERROR_NOT_READY:
      return cudaErrorNotReady;
    case CUDA_ERROR_NOT_SUPPORTED:
      return cudaErrorNotSupported;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
      return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
      return cudaErrorStreamCaptureInvalidated;
    case CUDA_ERROR_STREAM_CAPTURE_MERGE:
      return cudaErrorStreamCaptureMerge;
    case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED:
      return cudaErrorStreamCaptureUnmatched;
    case CUDA_ERROR_MAP_FAILED:
      return cudaErrorMapBufferObjectFailed;
    case CUDA_ERROR_STREAM_CAPTURE_UNJOINED:
      return cudaErrorStreamCaptureUnjoined;
    case CUDA_ERROR_STREAM_CAPTURE_ISOLATION:
      return cudaErrorStreamCaptureIsolation;
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
      return cudaErrorStreamCaptureImplicit;
    case CUDA_ERROR_CAPTURED_EVENT:
      return cudaErrorCapturedEvent;
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
      return cudaErrorStreamCaptureWrongThread;
    default:
      return cudaErrorUnknown;
  }
}

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};

constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge",
     "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined",
     "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText* findError(cudaError_t code) {
  for (const ErrorText& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

thread_local cudaError_t t_last_error = cudaSuccess;

// Failing calls leave their error for cudaGetLastError; successful calls do not clear it.
cudaError_t recordError(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

cudaError_t fromDriver(CUresult r) {
  return recordError(toRuntimeError(r));
}

// ---- driver and context ---------------------------------------------------------------------

std::atomic<const DriverApi*> g_driver{nullptr};
thread_local bool t_loading_driver = false;

// Loads the driver once. Racing first calls each resolve a table and one of them is kept, so no
// lock is held while calling into the driver (or into a hook on the way to it).
cudaError_t driver(const DriverApi** out) {
  if (const DriverApi* api = g_driver.load(std::memory_order_acquire)) {
    *out = api;
    return cudaSuccess;
  }
  // A hook that calls back into the runtime while the driver is being resolved.
  if (t_loading_driver) return cudaErrorInitializationError;
  t_loading_driver = true;
  auto fresh = std::make_unique<DriverApi>();
  const cudaError_t e = loadDriver(*fresh);
  t_loading_driver = false;
  if (e != cudaSuccess) return e;
  const DriverApi* expected = nullptr;
  if (g_driver.compare_exchange_strong(expected, fresh.get(), std::memory_order_acq_rel)) {
    expected = fresh.release();
  }
  *out = expected;
  return cudaSuccess;
}

// Calls the driver, initialising it again if it was reset underneath the runtime (the driver
// double's cudadouble_reset does that between tests).
template <class Call>
CUresult afterInit(const DriverApi& api, Call&& call) {
  CUresult r = call();
  if (r == CUDA_ERROR_NOT_INITIALIZED && api.init(0) == CUDA_SUCCESS) r = call();
  return r;
}

thread_local int t_device = 0;
std::array<std::atomic<CUcontext>, kMaxDevices> g_primary_contexts{};

// The runtime's teardown at exit, as the real one's: it gives up its reference to each primary
// context it retained, so a context nobody else retains is destroyed with everything in it
// before handlers registered earlier (such as a preloaded library's at load) run.
void releasePrimaryContexts() {
  const DriverApi* api = nullptr;
  if (driver(&api) != cudaSuccess) return;
  for (int device = 0; device < kMaxDevices; ++device) {
    if (g_primary_contexts[device].exchange(nullptr) == nullptr) continue;
    unsigned flags = 0;
    int active = 0;
    if (api->devicePrimaryCtxGetState(device, &flags, &active) == CUDA_SUCCESS && active) {
      api->devicePrimaryCtxRelease(device);
    }
  }
}

// Makes the primary context of the thread's current device current, retaining it once per
// device (again after the driver destroyed it), like the CUDA 12+ runtime.
cudaError_t enterContext(const DriverApi** out) {
  const DriverApi* api = nullptr;
  if (cudaError_t e = driver(&api)) return e;
  const int device = t_device;
  CUcontext current = nullptr;
  if (CUresult r = afterInit(*api, [&] { return api->ctxGetCurrent(&current); }))
    return toRuntimeError(r);
  CUcontext primary = g_primary_contexts[device].load();
  if (current == nullptr || current != primary) {
    unsigned flags = 0;
    int active = 0;
    if (CUresult r = api->devicePrimaryCtxGetState(device, &flags, &active))
      return toRuntimeError(r);
    if (!active || primary == nullptr) {
      if (CUresult r = api->devicePrimaryCtxRetain(&primary, device)) return toRuntimeError(r);
      g_primary_contexts[device].store(primary);
      static std::once_flag teardown;
      std::call_once(teardown, [] { std::atexit(releasePrimaryContexts); });
    }
    if (CUresult r = api->ctxSetCurrent(primary)) return toRuntimeError(r);
  }
  *out = api;
  return cudaSuccess;
}

// Runs `body` against the driver with the primary context current; maps and records its result.
template <class Body>
cudaError_t inContext(Body&& body) {
  const DriverApi* api = nullptr;
  if (cudaError_t e = enterContext(&api)) return recordError(e);
  return fromDriver(body(*api));
}

// Same, for calls that need an initialised driver but no context.
template <class Body>
cudaError_t withDriver(Body&& body) {
  const DriverApi* api = nullptr;
  if (cudaError_t e = driver(&api)) return recordError(e);
  return fromDriver(afterInit(*api, [&] { return body(*api); }));
}

CUdeviceptr devicePointer(const void* p) {
  return reinterpret_cast<CUdeviceptr>(p);
}
void* hostPointer(CUdeviceptr p) {
  return reinterpret_cast<void*>(p);
}

// ---- shared bodies of the legacy and per-thread entry points ----------------------------------

// Which set of driver functions a runtime entry point uses.
enum class DefaultStream { Legacy, PerThread };

template <class Function>
Function pick(DefaultStream mode, Function legacy, Function per_thread) {
  return mode == DefaultStream::PerThread ? per_thread : legacy;
}

cudaError_t memcpySync(DefaultStream mode, void* dst, const void* src, size_t count,
                       cudaMemcpyKind kind) {
  return inContext([&](const DriverApi& api) {
    switch (kind) {
      case cudaMemcpyHostToDevice:
        return pick(mode, api.memcpyHtoD, api.memcpyHtoDPerThread)(devicePointer(dst), src, count);
      case cudaMemcpyDeviceToHost:
        return pick(mode, api.memcpyDtoH, api.memcpyDtoHPerThread)(dst, devicePointer(src), count);
      case cudaMemcpyDeviceToDevice:
        return pick(mode, api.memcpyDtoD, api.memcpyDtoDPerThread)(devicePointer(dst),
                                                                   devicePointer(src), count);
      case cudaMemcpyHostToHost:
      case cudaMemcpyDefault:
        return pick(mode, api.memcpy, api.memcpyPerThread)(devicePointer(dst), devicePointer(src),
                                                           count);
    }
    return CUDA_ERROR_INVALID_VALUE;
  });
}

cudaError_t memcpyAsync(DefaultStream mode, void* dst, const void* src, size_t count,
                        cudaMemcpyKind kind, cudaStream_t stream) {
  return inContext([&](const DriverApi& api) {
    switch (kind) {
      case cudaMemcpyHostToDevice:
        return pick(mode, api.memcpyHtoDAsync, api.memcpyHtoDAsyncPerThread)(devicePointer(dst),
                                                                             src, count, stream);
      case cudaMemcpyDeviceToHost:
        return pick(mode, api.memcpyDtoHAsync, api.memcpyDtoHAsyncPerThread)(
            dst, devicePointer(src), count, stream);
      case cudaMemcpyDeviceToDevice:
        return pick(mode, api.memcpyDtoDAsync, api.memcpyDtoDAsyncPerThread)(
            devicePointer(dst), devicePointer(src), count, stream);
      case cudaMemcpyHostToHost:
      case cudaMemcpyDefault:
        return pick(mode, api.memcpyAsync, api.memcpyAsyncPerThread)(
            devicePointer(dst), devicePointer(src), count, stream);
    }
    return CUDA_ERROR_INVALID_VALUE;
  });
}

bool validMemcpyKind(cudaMemcpyKind kind) {
  return kind == cudaMemcpyHostToHost || kind == cudaMemcpyHostToDevice ||
         kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice ||
         kind == cudaMemcpyDefault;
}

cudaError_t mallocAsync(DefaultStream mode, void** devPtr, size_t size, cudaStream_t stream) {
  if (devPtr == nullptr) return recordError(cudaErrorInvalidValue);
  if (size == 0) {
    // As the real runtime does (seen on an H200 with CUDA 13.0): success, no memory.
    *devPtr = nullptr;
    return cudaSuccess;
  }
  return inContext([&](const DriverApi& api) {
    CUdeviceptr p = 0;
    const CUresult r = pick(mode, api.memAllocAsync, api.memAllocAsyncPerThread)(&p, size, stream);
    if (r == CUDA_SUCCESS) *devPtr = hostPointer(p);
    return r;
  });
}

cudaError_t mallocFromPoolAsync(DefaultStream mode, void** ptr, size_t size, cudaMemPool_t pool,
                                cudaStream_t stream) {
  if (ptr == nullptr || size == 0) return recordError(cudaErrorInvalidValue);
  return inContext([&](const DriverApi& api) {
    CUdeviceptr p = 0;
    const CUresult r = pick(mode, api.memAllocFromPoolAsync, api.memAllocFromPoolAsyncPerThread)(
        &p, size, pool, stream);
    if (r == CUDA_SUCCESS) *ptr = hostPointer(p);
    return r;
  });
}

cudaError_t freeAsync(DefaultStream mode, void* devPtr, cudaStream_t stream) {
  if (devPtr == nullptr) return cudaSuccess;  // as the real runtime does (CUDA 13.0, H200)
  return inContext([&](const DriverApi& api) {
    return pick(mode, api.memFreeAsync, api.memFreeAsyncPerThread)(devicePointer(devPtr), stream);
  });
}

cudaError_t memsetSync(DefaultStream mode, void* devPtr, int value, size_t count) {
  return inContext([&](const DriverApi& api) {
    return pick(mode, api.memsetD8, api.memsetD8PerThread)(
        devicePointer(devPtr), static_cast<unsigned char>(value), count);
  });
}

cudaError_t memsetAsync(DefaultStream mode, void* devPtr, int value, size_t count,
                        cudaStream_t stream) {
  return inContext([&](const DriverApi& api) {
    return pick(mode, api.memsetD8Async, api.memsetD8AsyncPerThread)(
        devicePointer(devPtr), static_cast<unsigned char>(value), count, stream);
  });
}

cudaError_t streamSynchronize(DefaultStream mode, cudaStream_t stream) {
  return inContext([&](const DriverApi& api) {
    return pick(mode, api.streamSynchronize, api.streamSynchronizePerThread)(stream);
  });
}

cudaError_t streamQuery(DefaultStream mode, cudaStream_t stream) {
  return inContext([&](const DriverApi& api) {
    return pick(mode, api.streamQuery, api.streamQueryPerThread)(stream);
  });
}

cudaError_t streamWaitEvent(DefaultStream mode, cudaStream_t stream, cudaEvent_t event,
                            unsigned int flags) {
  return inContext([&](const DriverApi& api) {
    return pick(mode, api.streamWaitEvent, api.streamWaitEventPerThread)(stream, event, flags);
  });
}

cudaError_t eventRecord(DefaultStream mode, cudaEvent_t event, cudaStream_t stream) {
  return inContext([&](const DriverApi& api) {
    return pick(mode, api.eventRecord, api.eventRecordPerThread)(event, stream);
  });
}

cudaError_t beginCapture(DefaultStream mode, cudaStream_t stream,
                         cudaStreamCaptureMode capture_mode) {
  return inContext([&](const DriverApi& api) {
    return pick(mode, api.streamBeginCapture, api.streamBeginCapturePerThread)(
        stream, static_cast<CUstreamCaptureMode>(capture_mode));
  });
}

cudaError_t endCapture(DefaultStream mode, cudaStream_t stream, cudaGraph_t* graph) {
  return inContext([&](const DriverApi& api) {
    return pick(mode, api.streamEndCapture, api.streamEndCapturePerThread)(stream, graph);
  });
}

cudaError_t isCapturing(DefaultStream mode, cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return recordError(cudaErrorInvalidValue);
  return inContext([&](const DriverApi& api) {
    CUstreamCaptureStatus driver_status = CU_STREAM_CAPTURE_STATUS_NONE;
    const CUresult r =
        pick(mode, api.streamIsCapturing, api.streamIsCapturingPerThread)(stream, &driver_status);
    if (r == CUDA_SUCCESS) *status = static_cast<cudaStreamCaptureStatus>(driver_status);
    return r;
  });
}

}  // namespace

// ================================ devices ======================================================

CUDART_DOUBLE_API cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return recordError(cudaErrorInvalidValue);
  *count = 0;
  return withDriver([&](const DriverApi& api) { return api.deviceGetCount(count); });
}

CUDART_DOUBLE_API cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return recordError(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

CUDART_DOUBLE_API cudaError_t cudaSetDevice(int device) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count)) return e;
  if (device < 0 || device >= count || device >= kMaxDevices)
    return recordError(cudaErrorInvalidDevice);
  t_device = device;
  const DriverApi* api = nullptr;
  return recordError(enterContext(&api));
}

CUDART_DOUBLE_API cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return recordError(cudaErrorInvalidValue);
  // cudaDeviceAttr uses the values of CUdevice_attribute.
  return withDriver([&](const DriverApi& api) {
    return api.deviceGetAttribute(value, static_cast<CUdevice_attribute>(attr), device);
  });
}

CUDART_DOUBLE_API cudaError_t cudaDeviceSynchronize(void) {
  return inContext([&](const DriverApi& api) { return api.ctxSynchronize(); });
}

CUDART_DOUBLE_API cudaError_t cudaDeviceReset(void) {
  return inContext([&](const DriverApi& api) { return api.devicePrimaryCtxReset(t_device); });
}

CUDART_DOUBLE_API cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return recordError(cudaErrorInvalidValue);
  *version = kRuntimeVersion;
  return cudaSuccess;
}

CUDART_DOUBLE_API cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return recordError(cudaErrorInvalidValue);
  *version = 0;  // what the runtime reports when no driver can be loaded
  const DriverApi* api = nullptr;
  if (driver(&api) != cudaSuccess) return cudaSuccess;
  return fromDriver(api->driverGetVersion(version));
}

// ================================ errors =======================================================

CUDART_DOUBLE_API cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

CUDART_DOUBLE_API cudaError_t cudaPeekAtLastError(void) {
  return t_last_error;
}

CUDART_DOUBLE_API const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* e = findError(error);
  return e ? e->text : "unrecognized error code";
}

CUDART_DOUBLE_API const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* e = findError(error);
  return e ? e->name : "unrecognized error code";
}

// ================================ memory =======================================================

CUDART_DOUBLE_API cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (devPtr == nullptr) return recordError(cudaErrorInvalidValue);
  if (size == 0) {
    *devPtr = nullptr;
    return cudaSuccess;
  }
  return inContext([&](const DriverApi& api) {
    CUdeviceptr p = 0;
    const CUresult r = api.memAlloc(&p, size);
    if (r == CUDA_SUCCESS) *devPtr = hostPointer(p);
    return r;
  });
}

CUDART_DOUBLE_API cudaError_t cudaFree(void* devPtr) {
  return inContext([&](const DriverApi& api) {
    // cudaFree(nullptr) only initialises the context.
    if (devPtr == nullptr) return CUDA_SUCCESS;
    // cudaFree waits for the device before the memory can be reused.
    if (CUresult r = api.ctxSynchronize()) return r;
    return api.memFree(devicePointer(devPtr));
  });
}

// Legacy IPC (the driver's, in the device's context). The runtime's handle is the driver's.
static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle), "one handle layout");

CUDART_DOUBLE_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  return inContext([&](const DriverApi& api) {
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return api.ipcGetMemHandle(reinterpret_cast<CUipcMemHandle*>(handle), devicePointer(devPtr));
  });
}

CUDART_DOUBLE_API cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle,
                                                   unsigned int flags) {
  return inContext([&](const DriverApi& api) {
    if (devPtr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUipcMemHandle h;
    std::memcpy(&h, &handle, sizeof h);
    CUdeviceptr p = 0;
    const CUresult r = api.ipcOpenMemHandle(&p, h, flags);
    if (r == CUDA_SUCCESS) *devPtr = reinterpret_cast<void*>(p);
    return r;
  });
}

CUDART_DOUBLE_API cudaError_t cudaIpcCloseMemHandle(void* devPtr) {
  return inContext(
      [&](const DriverApi& api) { return api.ipcCloseMemHandle(devicePointer(devPtr)); });
}

CUDART_DOUBLE_API cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) return recordError(cudaErrorInvalidValue);
  if (size == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  return inContext([&](const DriverApi& api) { return api.memAllocHost(ptr, size); });
}

CUDART_DOUBLE_API cudaError_t cudaFreeHost(void* ptr) {
  return inContext(
      [&](const DriverApi& api) { return ptr == nullptr ? CUDA_SUCCESS : api.memFreeHost(ptr); });
}

CUDART_DOUBLE_API cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  return inContext([&](const DriverApi& api) { return api.memGetInfo(free, total); });
}

CUDART_DOUBLE_API cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t stream) {
  return mallocAsync(DefaultStream::Legacy, devPtr, size, stream);
}

CUDART_DOUBLE_API cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size,
                                                   cudaStream_t stream) {
  return mallocAsync(DefaultStream::PerThread, devPtr, size, stream);
}

CUDART_DOUBLE_API cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t stream) {
  return freeAsync(DefaultStream::Legacy, devPtr, stream);
}

CUDART_DOUBLE_API cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t stream) {
  return freeAsync(DefaultStream::PerThread, devPtr, stream);
}

CUDART_DOUBLE_API cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size,
                                                      cudaMemPool_t memPool, cudaStream_t stream) {
  return mallocFromPoolAsync(DefaultStream::Legacy, ptr, size, memPool, stream);
}

CUDART_DOUBLE_API cudaError_t cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size,
                                                           cudaMemPool_t memPool,
                                                           cudaStream_t stream) {
  return mallocFromPoolAsync(DefaultStream::PerThread, ptr, size, memPool, stream);
}

CUDART_DOUBLE_API cudaError_t cudaMemcpy(void* dst, const void* src, size_t count,
                                         cudaMemcpyKind kind) {
  if (!validMemcpyKind(kind)) return recordError(cudaErrorInvalidMemcpyDirection);
  return memcpySync(DefaultStream::Legacy, dst, src, count, kind);
}

CUDART_DOUBLE_API cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t count,
                                              cudaMemcpyKind kind) {
  if (!validMemcpyKind(kind)) return recordError(cudaErrorInvalidMemcpyDirection);
  return memcpySync(DefaultStream::PerThread, dst, src, count, kind);
}

CUDART_DOUBLE_API cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count,
                                              cudaMemcpyKind kind, cudaStream_t stream) {
  if (!validMemcpyKind(kind)) return recordError(cudaErrorInvalidMemcpyDirection);
  return memcpyAsync(DefaultStream::Legacy, dst, src, count, kind, stream);
}

CUDART_DOUBLE_API cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count,
                                                   cudaMemcpyKind kind, cudaStream_t stream) {
  if (!validMemcpyKind(kind)) return recordError(cudaErrorInvalidMemcpyDirection);
  return memcpyAsync(DefaultStream::PerThread, dst, src, count, kind, stream);
}

CUDART_DOUBLE_API cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  return memsetSync(DefaultStream::Legacy, devPtr, value, count);
}

CUDART_DOUBLE_API cudaError_t cudaMemset_ptds(void* devPtr, int value, size_t count) {
  return memsetSync(DefaultStream::PerThread, devPtr, value, count);
}

CUDART_DOUBLE_API cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count,
                                              cudaStream_t stream) {
  return memsetAsync(DefaultStream::Legacy, devPtr, value, count, stream);
}

CUDART_DOUBLE_API cudaError_t cudaMemsetAsync_ptsz(void* devPtr, int value, size_t count,
                                                   cudaStream_t stream) {
  return memsetAsync(DefaultStream::PerThread, devPtr, value, count, stream);
}

CUDART_DOUBLE_API cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes,
                                                       const void* ptr) {
  if (attributes == nullptr) return recordError(cudaErrorInvalidValue);
  return inContext([&](const DriverApi& api) {
    std::memset(attributes, 0, sizeof *attributes);
    unsigned int type = 0;
    CUresult r =
        api.pointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, devicePointer(ptr));
    // Since CUDA 11 memory the driver does not know is "unregistered", not an error.
    if (r == CUDA_ERROR_INVALID_VALUE) {
      attributes->type = cudaMemoryTypeUnregistered;
      attributes->device = cudaInvalidDeviceId;
      attributes->hostPointer = const_cast<void*>(ptr);
      return CUDA_SUCCESS;
    }
    if (r != CUDA_SUCCESS) return r;
    int device = 0;
    if ((r = api.pointerGetAttribute(&device, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                     devicePointer(ptr))))
      return r;
    attributes->device = device;
    attributes->devicePointer = const_cast<void*>(ptr);
    if (type == CU_MEMORYTYPE_HOST) {
      attributes->type = cudaMemoryTypeHost;
      attributes->hostPointer = const_cast<void*>(ptr);
    } else {
      attributes->type = cudaMemoryTypeDevice;
    }
    return CUDA_SUCCESS;
  });
}

// ================================ memory pools =================================================

CUDART_DOUBLE_API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* memPool, int device) {
  return inContext(
      [&](const DriverApi& api) { return api.deviceGetDefaultMemPool(memPool, device); });
}

CUDART_DOUBLE_API cudaError_t cudaDeviceGetMemPool(cudaMemPool_t* memPool, int device) {
  return inContext([&](const DriverApi& api) { return api.deviceGetMemPool(memPool, device); });
}

CUDART_DOUBLE_API cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool) {
  return inContext([&](const DriverApi& api) { return api.deviceSetMemPool(device, memPool); });
}

CUDART_DOUBLE_API cudaError_t cudaMemPoolCreate(cudaMemPool_t* memPool,
                                                const cudaMemPoolProps* poolProps) {
  if (poolProps == nullptr) return recordError(cudaErrorInvalidValue);
  CUmemPoolProps props{};
  props.allocType = static_cast<CUmemAllocationType>(poolProps->allocType);
  props.handleTypes = static_cast<CUmemAllocationHandleType>(poolProps->handleTypes);
  props.location.type = static_cast<CUmemLocationType>(poolProps->location.type);
  props.location.id = poolProps->location.id;
  props.win32SecurityAttributes = poolProps->win32SecurityAttributes;
  props.maxSize = poolProps->maxSize;
  props.usage = poolProps->usage;
  return inContext([&](const DriverApi& api) { return api.memPoolCreate(memPool, &props); });
}

CUDART_DOUBLE_API cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
  return inContext([&](const DriverApi& api) { return api.memPoolDestroy(memPool); });
}

// cudaMemPoolAttr uses the values of CUmemPool_attribute.
CUDART_DOUBLE_API cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr,
                                                      void* value) {
  return inContext([&](const DriverApi& api) {
    return api.memPoolSetAttribute(memPool, static_cast<CUmemPool_attribute>(attr), value);
  });
}

CUDART_DOUBLE_API cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr,
                                                      void* value) {
  return inContext([&](const DriverApi& api) {
    return api.memPoolGetAttribute(memPool, static_cast<CUmemPool_attribute>(attr), value);
  });
}

CUDART_DOUBLE_API cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
  return inContext(
      [&](const DriverApi& api) { return api.memPoolTrimTo(memPool, minBytesToKeep); });
}

// ================================ streams, events, capture =====================================

CUDART_DOUBLE_API cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  return inContext(
      [&](const DriverApi& api) { return api.streamCreate(pStream, CU_STREAM_DEFAULT); });
}

CUDART_DOUBLE_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  return inContext([&](const DriverApi& api) { return api.streamCreate(pStream, flags); });
}

CUDART_DOUBLE_API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return inContext([&](const DriverApi& api) { return api.streamDestroy(stream); });
}

CUDART_DOUBLE_API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return streamSynchronize(DefaultStream::Legacy, stream);
}

CUDART_DOUBLE_API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream) {
  return streamSynchronize(DefaultStream::PerThread, stream);
}

CUDART_DOUBLE_API cudaError_t cudaStreamQuery(cudaStream_t stream) {
  return streamQuery(DefaultStream::Legacy, stream);
}

CUDART_DOUBLE_API cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream) {
  return streamQuery(DefaultStream::PerThread, stream);
}

CUDART_DOUBLE_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                                  unsigned int flags) {
  return streamWaitEvent(DefaultStream::Legacy, stream, event, flags);
}

CUDART_DOUBLE_API cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event,
                                                       unsigned int flags) {
  return streamWaitEvent(DefaultStream::PerThread, stream, event, flags);
}

CUDART_DOUBLE_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream,
                                                     cudaStreamCaptureMode mode) {
  return beginCapture(DefaultStream::Legacy, stream, mode);
}

CUDART_DOUBLE_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                                          cudaStreamCaptureMode mode) {
  return beginCapture(DefaultStream::PerThread, stream, mode);
}

CUDART_DOUBLE_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  return endCapture(DefaultStream::Legacy, stream, pGraph);
}

CUDART_DOUBLE_API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* pGraph) {
  return endCapture(DefaultStream::PerThread, stream, pGraph);
}

CUDART_DOUBLE_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                                    cudaStreamCaptureStatus* pCaptureStatus) {
  return isCapturing(DefaultStream::Legacy, stream, pCaptureStatus);
}

CUDART_DOUBLE_API cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream,
                                                         cudaStreamCaptureStatus* pCaptureStatus) {
  return isCapturing(DefaultStream::PerThread, stream, pCaptureStatus);
}

CUDART_DOUBLE_API cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr) return recordError(cudaErrorInvalidValue);
  return inContext([&](const DriverApi& api) {
    auto driver_mode = static_cast<CUstreamCaptureMode>(*mode);
    const CUresult r = api.threadExchangeStreamCaptureMode(&driver_mode);
    if (r == CUDA_SUCCESS) *mode = static_cast<cudaStreamCaptureMode>(driver_mode);
    return r;
  });
}

CUDART_DOUBLE_API cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  return inContext([&](const DriverApi& api) { return api.graphDestroy(graph); });
}

CUDART_DOUBLE_API cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return inContext([&](const DriverApi& api) { return api.eventCreate(event, CU_EVENT_DEFAULT); });
}

CUDART_DOUBLE_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  return inContext([&](const DriverApi& api) { return api.eventCreate(event, flags); });
}

CUDART_DOUBLE_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return eventRecord(DefaultStream::Legacy, event, stream);
}

CUDART_DOUBLE_API cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream) {
  return eventRecord(DefaultStream::PerThread, event, stream);
}

CUDART_DOUBLE_API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return inContext([&](const DriverApi& api) { return api.eventSynchronize(event); });
}

CUDART_DOUBLE_API cudaError_t cudaEventDestroy(cudaEvent_t event) {
  return inContext([&](const DriverApi& api) { return api.eventDestroy(event); });
}
