// The real CUDA runtime functions behind the runtime hooks, resolved once each on first use
// (DESIGN §1). The type of each comes from cuda_runtime_api.h, so a wrong signature does not
// compile. `_ptsz` forms (per-thread default stream builds) are not declared by the header:
// they are declared here with the type of their plain form.
#pragma once

#include <cuda_runtime_api.h>

extern "C" {
decltype(cudaMallocAsync) cudaMallocAsync_ptsz;
decltype(cudaFreeAsync) cudaFreeAsync_ptsz;
decltype(cudaStreamBeginCapture) cudaStreamBeginCapture_ptsz;
decltype(cudaStreamBeginCaptureToGraph) cudaStreamBeginCaptureToGraph_ptsz;
decltype(cudaStreamEndCapture) cudaStreamEndCapture_ptsz;
}

namespace poolshim::real {

// X(name, the function whose type it has)
#define POOLSHIM_RUNTIME_FUNCTIONS(X)                                  \
  X(cudaMalloc, cudaMalloc)                                            \
  X(cudaFree, cudaFree)                                                \
  X(cudaMallocAsync, cudaMallocAsync)                                  \
  X(cudaMallocAsync_ptsz, cudaMallocAsync)                             \
  X(cudaFreeAsync, cudaFreeAsync)                                      \
  X(cudaFreeAsync_ptsz, cudaFreeAsync)                                 \
  X(cudaGetDevice, cudaGetDevice)                                      \
  X(cudaMemGetInfo, cudaMemGetInfo)                                    \
  X(cudaDeviceReset, cudaDeviceReset)                                  \
  X(cudaDeviceSetMemPool, cudaDeviceSetMemPool)                        \
  X(cudaDeviceGetDefaultMemPool, cudaDeviceGetDefaultMemPool)          \
  X(cudaStreamBeginCapture, cudaStreamBeginCapture)                    \
  X(cudaStreamBeginCapture_ptsz, cudaStreamBeginCapture)               \
  X(cudaStreamBeginCaptureToGraph, cudaStreamBeginCaptureToGraph)      \
  X(cudaStreamBeginCaptureToGraph_ptsz, cudaStreamBeginCaptureToGraph) \
  X(cudaStreamEndCapture, cudaStreamEndCapture)                        \
  X(cudaStreamEndCapture_ptsz, cudaStreamEndCapture)                   \
  X(cudaDeviceEnablePeerAccess, cudaDeviceEnablePeerAccess)

enum class Function : int {
#define POOLSHIM_RUNTIME_ENUM(name, type_of) name,
  POOLSHIM_RUNTIME_FUNCTIONS(POOLSHIM_RUNTIME_ENUM)
#undef POOLSHIM_RUNTIME_ENUM
      count
};

/// The real function's address, or `missing` when no loaded CUDA runtime defines it.
void* resolve(Function f, const char* name, void* missing);

/// Stands in for a real function that cannot be found: the call fails the way a runtime
/// without the entry point would (and the shim says so once).
template <typename F>
struct Missing;
template <typename... Args>
struct Missing<cudaError_t (*)(Args...)> {
  static cudaError_t call(Args...) { return cudaErrorSharedObjectSymbolNotFound; }
};

// real::cudaMalloc()(devPtr, size) calls the real cudaMalloc.
#define POOLSHIM_RUNTIME_ACCESSOR(name, type_of)                                        \
  inline decltype(&::type_of) name() {                                                  \
    using Type = decltype(&::type_of);                                                  \
    return reinterpret_cast<Type>(                                                      \
        resolve(Function::name, #name, reinterpret_cast<void*>(&Missing<Type>::call))); \
  }
POOLSHIM_RUNTIME_FUNCTIONS(POOLSHIM_RUNTIME_ACCESSOR)
#undef POOLSHIM_RUNTIME_ACCESSOR

}  // namespace poolshim::real
