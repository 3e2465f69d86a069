// Helpers shared by the test programs: they print CUDA error names (never pointers or
// addresses), so that a run with the shim and one without can be compared line by line.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(call)                                               \
  do {                                                                 \
    const cudaError_t check_cuda_error_ = (call);                      \
    if (check_cuda_error_ != cudaSuccess) {                            \
      std::printf("FATAL %s:%d %s -> %s\n", __FILE__, __LINE__, #call, \
                  cudaGetErrorName(check_cuda_error_));                \
      std::exit(10);                                                   \
    }                                                                  \
  } while (0)

inline const char* name_of(cudaError_t e) {
  return cudaGetErrorName(e);
}
