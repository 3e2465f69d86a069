// tests/programs/ipc_share with kernels that write and read the shared buffers (issue 14 on
// the GPU): byte j of a buffer filled with `value` holds value + j / 4096, so that a page mapped
// at the wrong place, or a stale page, shows as well as a buffer never written. Built shared and
// static by tests/gpu/run_gpu.py; the output is the CPU program's.
#include <cuda_runtime.h>

#include <cstddef>

#define IPC_SHARE_KERNELS
#include "../programs/ipc_share.cpp"

namespace {

__device__ unsigned char pattern(std::size_t j, unsigned char value) {
  return static_cast<unsigned char>(value + (j >> 12));
}

__global__ void fill_kernel(unsigned char* p, std::size_t n, unsigned char value) {
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < n;
       j += std::size_t{gridDim.x} * blockDim.x)
    p[j] = pattern(j, value);
}

__global__ void check_kernel(const unsigned char* p, std::size_t n, unsigned char value,
                             unsigned long long* wrong) {
  unsigned long long mine = 0;
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < n;
       j += std::size_t{gridDim.x} * blockDim.x)
    mine += p[j] != pattern(j, value);
  if (mine != 0) atomicAdd(wrong, mine);
}

bool fill(void* p, int i, unsigned char value) {
  fill_kernel<<<264, 256>>>(static_cast<unsigned char*>(p), kSizes[i], value);
  return cudaDeviceSynchronize() == cudaSuccess;
}

bool holds(const void* p, int i, unsigned char value) {
  unsigned long long* wrong = nullptr;
  if (cudaMalloc(&wrong, sizeof *wrong) != cudaSuccess) return false;
  unsigned long long host = 1;
  const bool ran =
      cudaMemset(wrong, 0, sizeof *wrong) == cudaSuccess &&
      (check_kernel<<<264, 256>>>(static_cast<const unsigned char*>(p), kSizes[i], value, wrong),
       cudaMemcpy(&host, wrong, sizeof host, cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(wrong);
  return ran && host == 0;
}

}  // namespace
