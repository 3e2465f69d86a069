// The allocation churn of DESIGN §6 / issue 6: `live` buffers of mixed sizes (256 B to
// max_bytes, log-uniform, fixed seed), each iteration frees one at random and allocates a new
// one. Prints the checksum of sizes (identical with and without the shim) and the time per
// malloc+free pair on stderr-free stdout's last line, so benchmarks can read it.
//   churn [iterations] [live] [max_bytes] [sync|async] [touch]
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common.h"

int main(int argc, char** argv) {
  const long iterations = argc > 1 ? std::atol(argv[1]) : 2000;
  const int live = argc > 2 ? std::atoi(argv[2]) : 64;
  const double max_bytes = argc > 3 ? std::atof(argv[3]) : 128.0 * 1024 * 1024;
  const bool async = argc > 4 && std::strcmp(argv[4], "async") == 0;
  const bool touch = argc > 5 && std::strcmp(argv[5], "touch") == 0;
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(max_bytes));
  auto next_size = [&] { return static_cast<size_t>(std::exp(log_size(rng))); };

  cudaStream_t stream = nullptr;
  if (async) CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto alloc = [&](size_t n) {
    void* p = nullptr;
    CHECK_CUDA(async ? cudaMallocAsync(&p, n, stream) : cudaMalloc(&p, n));
    if (touch)
      CHECK_CUDA(async ? cudaMemsetAsync(p, 1, n < 4096 ? n : 4096, stream)
                       : cudaMemset(p, 1, n < 4096 ? n : 4096));
    return p;
  };
  auto release = [&](void* p) { CHECK_CUDA(async ? cudaFreeAsync(p, stream) : cudaFree(p)); };

  std::vector<void*> buffers(live);
  std::uint64_t checksum = 0;
  std::uint64_t allocated_bytes = 0;
  for (auto& b : buffers) {
    const size_t n = next_size();
    checksum += n;
    allocated_bytes += n;
    b = alloc(n);
  }
  if (async) CHECK_CUDA(cudaStreamSynchronize(stream));
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < iterations; ++i) {
    const size_t victim = rng() % buffers.size();
    release(buffers[victim]);
    const size_t n = next_size();
    checksum = checksum * 31 + n;
    allocated_bytes += n;
    buffers[victim] = alloc(n);
  }
  if (async) CHECK_CUDA(cudaStreamSynchronize(stream));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (void* b : buffers) release(b);
  if (async) {
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaStreamDestroy(stream));
  }
  std::printf("churn: iterations=%ld live=%d mode=%s checksum=%llu allocated_bytes=%llu\n",
              iterations, live, async ? "async" : "sync", static_cast<unsigned long long>(checksum),
              static_cast<unsigned long long>(allocated_bytes));
  std::fprintf(stderr, "us_per_pair %.3f\n", iterations > 0 ? seconds * 1e6 / iterations : 0.0);
  return 0;
}
