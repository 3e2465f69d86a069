// Uses the CUDA runtime without allocating device memory: under the shim it must leave no
// log file behind (DESIGN §5: the log is created at the first device-memory call).
#include <cuda_runtime_api.h>

#include <cstdio>

int main() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  std::printf("no_alloc: %s devices=%d\n", cudaGetErrorName(e), count);
  return 0;
}
