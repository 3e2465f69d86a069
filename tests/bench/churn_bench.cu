// Allocation churn for the benchmark suite (issue 6; run by tests/bench/run_bench.py): `live`
// buffers of log-uniform sizes 256 B to max_bytes (fixed seed); each iteration frees one at
// random and allocates a new one, optionally launching a tiny kernel that writes the new
// buffer's first min(n, 4096) bytes. The first `warmup` iterations are not timed (nor counted by
// the call timer of scripts/bench's profile section). Prints one line:
//   churn_bench: api=A live=L touch=T iterations=N warmup=W max_bytes=M checksum=C us_per_pair=X
//                live_peak_bytes=P
//
//   churn_bench API ITERATIONS LIVE MAX_BYTES [none|kernel] [WARMUP]
//
// API  malloc      cudaMalloc / cudaFree; the kernel runs on the legacy default stream
//      async       cudaMallocAsync / cudaFreeAsync on one non-blocking stream: the device's
//                  default pool natively, poolshim's pool under the shim
//      async_keep  the same, after setting the default pool's release threshold to UINT64_MAX
//                  (natively the pool then keeps what it reserved, as a warmed pool does)
//      pool        cudaMallocFromPoolAsync / cudaFreeAsync on a pool this program creates,
//                  configured as poolshim configures its own (pinned device memory, release
//                  threshold UINT64_MAX, reuse: event dependencies and opportunistic on,
//                  internal dependencies off): the floor the shim's cudaMallocAsync adds to
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_pool.h"
#include "common.h"

namespace {

constexpr size_t kTouchBytes = 4096;

__global__ void touch_bytes(unsigned char* buffer, size_t n) {
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) buffer[i] = 1;
}

enum class Api { malloc, async, async_keep, pool };

Api parse_api(const char* text) {
  const std::string s = text;
  if (s == "malloc") return Api::malloc;
  if (s == "async") return Api::async;
  if (s == "async_keep") return Api::async_keep;
  if (s == "pool") return Api::pool;
  std::fprintf(stderr, "churn_bench: unknown api %s (malloc, async, async_keep, pool)\n", text);
  std::exit(2);
}

const char* api_name(Api api) {
  switch (api) {
    case Api::malloc:
      return "malloc";
    case Api::async:
      return "async";
    case Api::async_keep:
      return "async_keep";
    case Api::pool:
      return "pool";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr,
                 "usage: churn_bench API ITERATIONS LIVE MAX_BYTES [none|kernel] [WARMUP]\n");
    return 2;
  }
  const Api api = parse_api(argv[1]);
  const long iterations = std::atol(argv[2]);
  const int live = std::atoi(argv[3]);
  const double max_bytes = std::atof(argv[4]);
  const bool touch = argc > 5 && std::strcmp(argv[5], "kernel") == 0;
  const long warmup = argc > 6 ? std::atol(argv[6]) : 0;
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(max_bytes));
  auto next_size = [&] { return static_cast<size_t>(std::exp(log_size(rng))); };

  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaFree(nullptr));  // context creation stays out of every figure
  cudaStream_t stream = nullptr;  // the legacy default stream for api=malloc
  cudaMemPool_t pool = nullptr;
  if (api != Api::malloc) CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (api == Api::async_keep) {
    cudaMemPool_t default_pool = nullptr;
    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&default_pool, device));
    std::uint64_t keep_everything = UINT64_MAX;
    CHECK_CUDA(
        cudaMemPoolSetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  }
  if (api == Api::pool) pool = make_pool_like_poolshim(device);

  auto allocate = [&](size_t n) {
    void* p = nullptr;
    switch (api) {
      case Api::malloc:
        CHECK_CUDA(cudaMalloc(&p, n));
        break;
      case Api::async:
      case Api::async_keep:
        CHECK_CUDA(cudaMallocAsync(&p, n, stream));
        break;
      case Api::pool:
        CHECK_CUDA(cudaMallocFromPoolAsync(&p, n, pool, stream));
        break;
    }
    if (touch) {
      touch_bytes<<<1, 256, 0, stream>>>(static_cast<unsigned char*>(p),
                                         n < kTouchBytes ? n : kTouchBytes);
      CHECK_CUDA(cudaGetLastError());
    }
    return p;
  };
  auto release = [&](void* p) {
    CHECK_CUDA(api == Api::malloc ? cudaFree(p) : cudaFreeAsync(p, stream));
  };
  auto drain = [&] {
    CHECK_CUDA(api == Api::malloc ? cudaDeviceSynchronize() : cudaStreamSynchronize(stream));
  };

  std::vector<void*> buffers(live);
  std::vector<size_t> sizes(live);
  std::uint64_t checksum = 0;
  size_t live_bytes = 0;
  size_t live_peak = 0;  // what the program itself holds at most (the footprint section's base)
  for (int i = 0; i < live; ++i) {
    const size_t n = next_size();
    checksum += n;
    buffers[i] = allocate(n);
    sizes[i] = n;
    live_bytes += n;
  }
  live_peak = live_bytes;
  auto churn = [&](long count) {
    for (long i = 0; i < count; ++i) {
      const size_t victim = rng() % buffers.size();
      release(buffers[victim]);
      live_bytes -= sizes[victim];
      const size_t n = next_size();
      checksum = checksum * 31 + n;
      buffers[victim] = allocate(n);
      sizes[victim] = n;
      live_bytes += n;
      if (live_bytes > live_peak) live_peak = live_bytes;
    }
  };
  churn(warmup);
  drain();
  // Under scripts/bench's call timer (tests/perf/call_timer.cpp) only the timed pairs count.
  if (auto reset = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "call_timer_reset"))) reset();
  const auto start = std::chrono::steady_clock::now();
  churn(iterations);
  drain();  // the stream-ordered work of the timed pairs is part of their cost
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (void* b : buffers) release(b);
  drain();
  if (stream != nullptr) CHECK_CUDA(cudaStreamDestroy(stream));
  if (pool != nullptr) CHECK_CUDA(cudaMemPoolDestroy(pool));
  std::printf(
      "churn_bench: api=%s live=%d touch=%s iterations=%ld warmup=%ld max_bytes=%.0f checksum=%llu "
      "us_per_pair=%.4f live_peak_bytes=%zu\n",
      api_name(api), live, touch ? "kernel" : "none", iterations, warmup, max_bytes,
      static_cast<unsigned long long>(checksum), iterations > 0 ? seconds * 1e6 / iterations : 0.0,
      live_peak);
  return 0;
}
