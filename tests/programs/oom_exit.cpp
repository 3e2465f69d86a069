// A legacy program that dies on out-of-memory the usual way: it checks cudaMalloc's result,
// prints a message and exits with status 3. Under the shim the exit status must be the same
// and the log must hold an `oom` record.
//   oom_exit [bytes]   (default: twice the device's memory)
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 4;
  const size_t want = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : total * 2;
  void* keep = nullptr;
  if (cudaMalloc(&keep, 1 << 20) != cudaSuccess) return 5;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, want);
  if (e != cudaSuccess) {
    std::printf("allocation failed: %s\n", cudaGetErrorName(e));
    std::exit(3);
  }
  std::printf("allocation succeeded\n");
  return 0;
}
