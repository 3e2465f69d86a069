// Streams and allocations of every kind, then the count of each driver call the process made,
// as the CPU double counts them (cudadouble_call_count): run natively and under
// POOLSHIM_MODE=observe the counts must be identical, since observe mode makes no CUDA call of
// its own; in pool mode they differ (the pool's fences record events), which shows the counts
// can tell. On a real driver there is no counter and it says so.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <initializer_list>

#include "common.h"

int main() {
  cudaStream_t streams[3];
  CHECK_CUDA(cudaStreamCreateWithFlags(&streams[0], cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&streams[1], cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&streams[2], cudaStreamDefault));
  for (int round = 0; round < 4; ++round) {
    void* plain = nullptr;
    CHECK_CUDA(cudaMalloc(&plain, (size_t{1} << 20) << round));
    for (cudaStream_t s : streams) {
      void* p = nullptr;
      CHECK_CUDA(cudaMallocAsync(&p, 4096 << round, s));
      CHECK_CUDA(cudaMemsetAsync(p, round, 4096 << round, s));
      CHECK_CUDA(cudaFreeAsync(p, s));
    }
    CHECK_CUDA(cudaFree(plain));
  }
  for (cudaStream_t s : streams) CHECK_CUDA(cudaStreamSynchronize(s));
  for (cudaStream_t s : streams) CHECK_CUDA(cudaStreamDestroy(s));
  using CallCount = unsigned long long (*)(const char*);
  // The runtime loaded the driver library itself (RTLD_LOCAL): ask that handle.
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  auto count = driver == nullptr
                   ? nullptr
                   : reinterpret_cast<CallCount>(dlsym(driver, "cudadouble_call_count"));
  if (count == nullptr) {
    std::printf("no call counter (not the CPU double)\n");
    return 0;
  }
  for (const char* name :
       {"cuEventCreate", "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuStreamWaitEvent",
        "cuStreamSynchronize", "cuCtxSynchronize", "cuMemAlloc_v2", "cuMemFree_v2",
        "cuMemAllocAsync", "cuMemFreeAsync", "cuStreamCreate", "cuStreamDestroy_v2"}) {
    std::printf("%s %llu\n", name, count(name));
  }
  return 0;
}
