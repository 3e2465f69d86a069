// Eight threads allocate, write, check and free concurrently (cudaMalloc/cudaFree and
// cudaMallocAsync/cudaFreeAsync on per-thread streams): no lost or corrupted block.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

int main() {
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t, &bad] {
      cudaStream_t s = nullptr;
      CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      std::vector<unsigned char> host(1 << 16), back(1 << 16);
      for (int i = 0; i < 300; ++i) {
        const size_t n = 256 + static_cast<size_t>((i * 131 + t * 17) % 60000);
        const bool async = (i + t) % 2 == 0;
        void* p = nullptr;
        CHECK_CUDA(async ? cudaMallocAsync(&p, n, s) : cudaMalloc(&p, n));
        std::memset(host.data(), (t * 31 + i) & 0xff, n);
        CHECK_CUDA(cudaMemcpyAsync(p, host.data(), n, cudaMemcpyHostToDevice, s));
        CHECK_CUDA(cudaMemcpyAsync(back.data(), p, n, cudaMemcpyDeviceToHost, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        if (std::memcmp(host.data(), back.data(), n) != 0) bad.fetch_add(1);
        CHECK_CUDA(async ? cudaFreeAsync(p, s) : cudaFree(p));
      }
      CHECK_CUDA(cudaStreamSynchronize(s));
      CHECK_CUDA(cudaStreamDestroy(s));
    });
  }
  for (auto& th : threads) th.join();
  std::printf("threads: 8 x 300 allocations, corrupted=%d\n", bad.load());
  return bad.load() == 0 ? 0 : 1;
}
