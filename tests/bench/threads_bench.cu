// Allocation throughput from several threads for the benchmark suite (issue 6; run by
// tests/bench/run_bench.py). For each thread count in turn: every thread creates its own
// non-blocking stream and fills `live` buffers of log-uniform sizes 256 B to max_bytes (seed
// per thread), then all wait at a barrier; from the barrier to the last join each thread does
// `pairs` iterations of free-one-at-random / allocate-one on its stream, then synchronizes its
// stream. Buffers and streams are released after the clock stops. One line per thread count:
//   threads_bench: api=A threads=T pairs_per_thread=P live=L seconds=S mpairs_per_s=R checksum=C
//
//   threads_bench API THREAD_COUNTS PAIRS_PER_THREAD LIVE MAX_BYTES     (THREAD_COUNTS: 1,2,4,8)
//
// API  async  cudaMallocAsync / cudaFreeAsync: the device's default pool natively, poolshim's
//             pool under the shim
//      pool   cudaMallocFromPoolAsync / cudaFreeAsync on one pool this program creates for all
//             threads, configured as poolshim configures its own (pinned device memory, release
//             threshold UINT64_MAX, internal-dependency reuse off)
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_pool.h"
#include "common.h"

namespace {

struct Worker {
  cudaStream_t stream = nullptr;
  std::vector<void*> buffers;
  std::uint64_t checksum = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr,
                 "usage: threads_bench async|pool THREAD_COUNTS PAIRS_PER_THREAD LIVE MAX_BYTES\n");
    return 2;
  }
  const std::string api = argv[1];
  if (api != "async" && api != "pool") {
    std::fprintf(stderr, "threads_bench: unknown api %s (async, pool)\n", argv[1]);
    return 2;
  }
  std::vector<int> thread_counts;
  std::stringstream list(argv[2]);
  for (std::string item; std::getline(list, item, ',');)
    thread_counts.push_back(std::atoi(item.c_str()));
  const long pairs = std::atol(argv[3]);
  const int live = std::atoi(argv[4]);
  const double max_bytes = std::atof(argv[5]);

  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaFree(nullptr));  // context creation stays out of every figure
  cudaMemPool_t pool = api == "pool" ? make_pool_like_poolshim(device) : nullptr;

  for (const int count : thread_counts) {
    std::vector<Worker> workers(count);
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < count; ++t) {
      threads.emplace_back([&, t] {
        Worker& w = workers[t];
        std::mt19937_64 rng(12345 + t);
        std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(max_bytes));
        auto next_size = [&] { return static_cast<size_t>(std::exp(log_size(rng))); };
        auto allocate = [&](size_t n) {
          void* p = nullptr;
          CHECK_CUDA(pool != nullptr ? cudaMallocFromPoolAsync(&p, n, pool, w.stream)
                                     : cudaMallocAsync(&p, n, w.stream));
          return p;
        };
        CHECK_CUDA(cudaSetDevice(device));
        CHECK_CUDA(cudaStreamCreateWithFlags(&w.stream, cudaStreamNonBlocking));
        w.buffers.resize(live);
        for (auto& b : w.buffers) {
          const size_t n = next_size();
          w.checksum += n;
          b = allocate(n);
        }
        CHECK_CUDA(cudaStreamSynchronize(w.stream));
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        for (long i = 0; i < pairs; ++i) {
          const size_t victim = rng() % w.buffers.size();
          CHECK_CUDA(cudaFreeAsync(w.buffers[victim], w.stream));
          const size_t n = next_size();
          w.checksum = w.checksum * 31 + n;
          w.buffers[victim] = allocate(n);
        }
        CHECK_CUDA(cudaStreamSynchronize(w.stream));
      });
    }
    while (ready.load() < count) std::this_thread::yield();
    const auto start = std::chrono::steady_clock::now();
    go.store(true, std::memory_order_release);
    for (auto& th : threads) th.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    std::uint64_t checksum = 0;
    for (Worker& w : workers) {
      for (void* b : w.buffers) CHECK_CUDA(cudaFreeAsync(b, w.stream));
      CHECK_CUDA(cudaStreamSynchronize(w.stream));
      CHECK_CUDA(cudaStreamDestroy(w.stream));
      checksum = checksum * 131 + w.checksum;
    }
    std::printf(
        "threads_bench: api=%s threads=%d pairs_per_thread=%ld live=%d seconds=%.6f "
        "mpairs_per_s=%.5f checksum=%llu\n",
        api.c_str(), count, pairs, live, seconds, seconds > 0 ? count * pairs / seconds / 1e6 : 0.0,
        static_cast<unsigned long long>(checksum));
    std::fflush(stdout);
  }
  if (pool != nullptr) CHECK_CUDA(cudaMemPoolDestroy(pool));
  return 0;
}
