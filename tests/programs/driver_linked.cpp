// A driver-API program linked against libcuda (-lcuda): its calls bind to the exported driver
// symbols, which the shim interposes directly. Prints results and a checksum, no pointers.
#include <cuda.h>

#include <cstdio>
#include <vector>

#define CHECK_CU(call)                                                            \
  do {                                                                            \
    const CUresult check_cu_result_ = (call);                                     \
    if (check_cu_result_ != CUDA_SUCCESS) {                                       \
      std::printf("FATAL %s -> %d\n", #call, static_cast<int>(check_cu_result_)); \
      return 10;                                                                  \
    }                                                                             \
  } while (0)

int main() {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CHECK_CU(cuInit(0));
  CHECK_CU(cuDeviceGet(&dev, 0));
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_CU(cuCtxSetCurrent(ctx));
  CUstream stream = nullptr;
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  unsigned long long sum = 0;
  std::vector<unsigned char> host(1 << 16);
  for (int i = 0; i < 100; ++i) {
    const size_t n = 4096 + static_cast<size_t>(i) * 517;
    CUdeviceptr a = 0, b = 0;
    CHECK_CU(cuMemAlloc(&a, n));
    CHECK_CU(cuMemAllocAsync(&b, n, stream));
    CHECK_CU(cuMemsetD8Async(b, static_cast<unsigned char>(i), n, stream));
    CHECK_CU(cuMemcpyDtoDAsync(a, b, n, stream));
    CHECK_CU(cuMemcpyDtoHAsync(host.data(), a, n < host.size() ? n : host.size(), stream));
    CHECK_CU(cuStreamSynchronize(stream));
    sum += host[0] + host[n < host.size() ? n - 1 : host.size() - 1];
    CHECK_CU(cuMemFreeAsync(b, stream));
    CHECK_CU(cuMemFree(a));
  }
  size_t free = 0, total = 0;
  CHECK_CU(cuMemGetInfo(&free, &total));
  CHECK_CU(cuStreamSynchronize(stream));
  CHECK_CU(cuStreamDestroy(stream));
  std::printf("driver_linked: 200 allocations, checksum %llu, meminfo ok %d\n", sum, free <= total);
  return 0;
}
