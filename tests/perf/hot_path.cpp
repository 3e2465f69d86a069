// The shim's own cost on the hot path, without a GPU: cudaMallocAsync/cudaFreeAsync pairs that
// hit the user-space cache, through the Router over the CPU driver double, on 1..N threads
// (each on its own stream, sizes 256 B - 4 MiB log-uniform, 16 live per thread: the threads
// workload of scripts/bench). A hit makes no driver call, so this is the Router's code alone:
// what is left of a pair's time once the driver is out of the way, and how it scales.
//   hot_path [pairs_per_thread] [max_threads]
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "cudadouble.h"
#include "router.h"

using namespace poolshim;

int main(int argc, char** argv) {
  const int pairs = argc > 1 ? std::atoi(argv[1]) : 200000;
  const int max_threads = argc > 2 ? std::atoi(argv[2]) : 16;
  void* handle = dlopen(POOLSHIM_DOUBLE_DRIVER, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return 1;
  auto reset = reinterpret_cast<void (*)(int, size_t)>(dlsym(handle, "cudadouble_reset"));
  reset(1, size_t{64} << 30);
  DriverApi api;
  if (!api.load(POOLSHIM_DOUBLE_DRIVER, [](void* h, const char* n) { return dlsym(h, n); }).empty())
    return 1;
  Config config = Config::defaults();
  EventQueue events;
  Router router(api, config, events);
  StreamRegistry streams;
  streams.mark_observed();
  router.set_stream_registry(&streams);
  double single = 0;
  for (int threads = 1; threads <= max_threads; threads *= 2) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        CUdevice dev = 0;
        CUcontext ctx = nullptr;
        api.cuDeviceGet(&dev, 0);
        api.cuDevicePrimaryCtxRetain(&ctx, dev);
        api.cuCtxSetCurrent(ctx);
        CUstream stream = nullptr;
        api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
        std::mt19937_64 rng(static_cast<unsigned>(t + 1));
        std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(4194304.0));
        auto next_size = [&] { return static_cast<size_t>(std::exp(log_size(rng))); };
        auto real_alloc = [](size_t, CUdeviceptr*) { return RealResult::error; };
        auto real_free = [](void*) { return RealResult::error; };
        std::vector<CUdeviceptr> live(16);
        for (auto& p : live) router.allocate_async(0, next_size(), stream, &p, real_alloc);
        auto pair = [&] {
          const size_t victim = rng() % live.size();
          router.free_async(reinterpret_cast<void*>(live[victim]), stream, real_free);
          router.allocate_async(0, next_size(), stream, &live[victim], real_alloc);
        };
        for (int i = 0; i < 20000; ++i) pair();  // warm the cache
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {
        }
        for (int i = 0; i < pairs; ++i) pair();
      });
    }
    while (ready.load() < threads) {
    }
    const auto start = std::chrono::steady_clock::now();
    go.store(true, std::memory_order_release);
    for (auto& w : workers) w.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double rate = threads * pairs / seconds / 1e6;
    if (threads == 1) single = rate;
    std::printf("hot_path threads=%d mpairs_per_s=%.3f ns_per_pair_per_thread=%.0f scaling=%.2f\n",
                threads, rate, seconds * 1e9 / pairs, rate / single);
  }
  const DeviceSnapshot s = router.snapshot(0);
  std::printf("hot_path cache_hits=%llu cache_misses=%llu fences=%llu bounded_syncs=%llu\n",
              static_cast<unsigned long long>(s.stats.cache_hits),
              static_cast<unsigned long long>(s.stats.cache_misses),
              static_cast<unsigned long long>(s.stats.fences),
              static_cast<unsigned long long>(s.stats.bounded_syncs));
  return 0;
}
