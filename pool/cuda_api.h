// The table of real CUDA driver functions that the core calls (DESIGN §1). The core never
// calls an exported name directly: it calls through this table, which points at the real
// libcuda.so.1 (or at the CPU test double in tests), so the shim's own calls cannot re-enter
// its hooks. Each pointer's type is decltype(&::name) from cuda.h: a wrong signature does not
// compile.
#pragma once

#include <cuda.h>

#include <string>

namespace poolshim {

// The explicit _v2 names are the ones cuda.h's macros select; they are real exported symbols.
#define POOLSHIM_DRIVER_FUNCTIONS(X)   \
  X(cuInit)                            \
  X(cuDriverGetVersion)                \
  X(cuGetErrorName)                    \
  X(cuDeviceGetCount)                  \
  X(cuDeviceGet)                       \
  X(cuDeviceGetName)                   \
  X(cuDeviceTotalMem_v2)               \
  X(cuDevicePrimaryCtxRetain)          \
  X(cuDevicePrimaryCtxRelease_v2)      \
  X(cuCtxGetCurrent)                   \
  X(cuCtxSetCurrent)                   \
  X(cuCtxPushCurrent_v2)               \
  X(cuCtxPopCurrent_v2)                \
  X(cuCtxSynchronize)                  \
  X(cuCtxGetDevice)                    \
  X(cuDevicePrimaryCtxGetState)        \
  X(cuEventCreate)                     \
  X(cuEventRecord)                     \
  X(cuEventQuery)                      \
  X(cuEventDestroy_v2)                 \
  X(cuStreamWaitEvent)                 \
  X(cuStreamGetCtx)                    \
  X(cuThreadExchangeStreamCaptureMode) \
  X(cuMemPoolSetAccess)                \
  X(cuStreamCreate)                    \
  X(cuStreamDestroy_v2)                \
  X(cuStreamSynchronize)               \
  X(cuStreamQuery)                     \
  X(cuStreamGetDevice)                 \
  X(cuStreamIsCapturing)               \
  X(cuMemAlloc_v2)                     \
  X(cuMemFree_v2)                      \
  X(cuMemPoolCreate)                   \
  X(cuMemPoolDestroy)                  \
  X(cuMemPoolSetAttribute)             \
  X(cuMemPoolGetAttribute)             \
  X(cuMemPoolTrimTo)                   \
  X(cuMemAllocFromPoolAsync)           \
  X(cuMemFreeAsync)                    \
  X(cuMemGetInfo_v2)                   \
  X(cuDeviceGetAttribute)              \
  X(cuMemGetAllocationGranularity)     \
  X(cuMemAddressReserve)               \
  X(cuMemAddressFree)                  \
  X(cuMemCreate)                       \
  X(cuMemRelease)                      \
  X(cuMemMap)                          \
  X(cuMemUnmap)                        \
  X(cuMemSetAccess)                    \
  X(cuMemExportToShareableHandle)      \
  X(cuMemImportFromShareableHandle)

struct DriverApi {
#define POOLSHIM_DRIVER_POINTER(name) decltype(&::name) name = nullptr;
  POOLSHIM_DRIVER_FUNCTIONS(POOLSHIM_DRIVER_POINTER)
#undef POOLSHIM_DRIVER_POINTER

  /// Opens `library` (dlopen, local scope) and resolves every function with `lookup`, which
  /// is dlsym or, in the shim, the real dlsym behind its hook. Then calls cuInit(0).
  /// Returns an empty string on success, else what went wrong (for the one warning).
  using Lookup = void* (*)(void* handle, const char* name);
  std::string load(const char* library, Lookup lookup);

  /// "CUDA_ERROR_OUT_OF_MEMORY" for a result code; never null.
  const char* error_name(CUresult r) const;
};

/// Puts the calling thread in relaxed stream-capture mode for the scope (DESIGN §3: the shim's
/// own calls must never invalidate or fail because of an application's capture) and restores
/// the thread's mode afterwards.
class RelaxedCaptureScope {
 public:
  explicit RelaxedCaptureScope(const DriverApi& driver) : driver_(driver) {
    mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
    active_ = driver_.cuThreadExchangeStreamCaptureMode != nullptr &&
              driver_.cuThreadExchangeStreamCaptureMode(&mode_) == CUDA_SUCCESS;
  }
  ~RelaxedCaptureScope() {
    if (active_) driver_.cuThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  const DriverApi& driver_;
  CUstreamCaptureMode mode_;
  bool active_ = false;
};

/// Makes `ctx` current for the scope when it is not already (push/pop keeps the caller's).
class ScopedContext {
 public:
  ScopedContext(const DriverApi& driver, CUcontext ctx) : driver_(driver) {
    CUcontext current = nullptr;
    if (driver_.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == ctx) return;
    pushed_ = driver_.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
  }
  ~ScopedContext() {
    if (pushed_) {
      CUcontext popped = nullptr;
      driver_.cuCtxPopCurrent_v2(&popped);
    }
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const DriverApi& driver_;
  bool pushed_ = false;
};

}  // namespace poolshim
