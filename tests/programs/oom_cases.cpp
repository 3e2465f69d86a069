// A legacy-style program that runs out of device memory in one of three ways, for the OOM
// report's verdicts. It keeps what it allocated, and on the first failure prints what it got
// and exits with status 3, as such programs do.
//   oom_cases exhausted      blocks of 4 MiB until the device is full (run with a small
//                            device: CUDADOUBLE_MEM=32M)
//   oom_cases fragmentation  thirty-two 1 MiB blocks, every other one freed, then a 2 MiB one
//                            (CUDADOUBLE_MEM=32M: the pool holds 16 MiB unused, in 1 MiB
//                            pieces, one in each 2 MiB segment)
//   oom_cases cap            layers of 4 MiB under POOLSHIM_LIMIT=16M, on a large device
//   oom_cases retry          five attempts at 64 MiB under POOLSHIM_LIMIT=8M, then exit
//   oom_cases layers N       layers of N MiB until failure (the GPU test's legacy program)
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

std::vector<void*> g_held;

// Each allocating function is its own frame, so the report can name it.
__attribute__((noinline)) bool allocate_layer(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    std::printf("allocation of %zu bytes failed after %zu: %s\n", bytes, g_held.size(),
                cudaGetErrorName(e));
    return false;
  }
  g_held.push_back(p);
  return true;
}

__attribute__((noinline)) bool hold_block(size_t bytes) {
  return allocate_layer(bytes);
}

[[noreturn]] void die() {
  std::exit(3);  // the legacy way: exit on out-of-memory, leaking what was held
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "exhausted";
  const size_t MiB = size_t{1} << 20;
  if (std::strcmp(mode, "exhausted") == 0) {
    for (;;) {
      if (!allocate_layer(4 * MiB)) die();
    }
  } else if (std::strcmp(mode, "fragmentation") == 0) {
    for (int i = 0; i < 32; ++i) {
      if (!hold_block(MiB)) die();
    }
    for (int i = 0; i < 32; i += 2) cudaFree(g_held[i]);
    if (!allocate_layer(2 * MiB)) die();
  } else if (std::strcmp(mode, "cap") == 0) {
    for (int i = 0; i < 3; ++i) {
      if (!allocate_layer(4 * MiB)) die();
    }
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    std::printf("meminfo: free %zu MiB of %zu MiB\n", free / MiB, total / MiB);
    if (!allocate_layer(6 * MiB)) die();
  } else if (std::strcmp(mode, "retry") == 0) {
    // A retry loop around an allocation that cannot succeed.
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (allocate_layer(64 * MiB)) break;
    }
    die();
  } else if (std::strcmp(mode, "layers") == 0) {
    const size_t layer = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 256) * MiB;
    for (;;) {
      if (!allocate_layer(layer)) die();
    }
  }
  std::printf("no out-of-memory\n");
  return 0;
}
