// call_timer: a measuring tool of the benchmark suite, not part of the product. Preloaded in
// front of everything else (LD_PRELOAD="libcall_timer.so [libpoolshim.so]"), it times each call
// the application makes to the runtime's allocation and synchronization entry points, whatever
// answers them: the real runtime natively, poolshim when it is preloaded after this library.
// The same program timed with and without the shim shows where the allocation time of a run
// goes (scripts/bench's "profile" section). At exit it writes one line per function called:
//
//   call_timer: fn=cudaMalloc calls=N total_us=T mean_us=M p50_us=A p99_us=B max_us=C
//               slow_calls=S slow_us=U            (one line; slow = at least CALL_TIMER_SLOW_US)
//
// to stderr, or appended to the file CALL_TIMER_OUT. A program that has a warm-up calls
// `call_timer_reset` (dlsym(RTLD_DEFAULT, ...)) when it ends, so that only the timed part counts.
// Percentiles come from buckets of 1/8 of a power of two: exact to 9%.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace {

using Error = int;  // cudaError_t
using Stream = void*;

constexpr int kSubBuckets = 8;
constexpr int kBuckets = 48 * kSubBuckets;

int bucket_of(std::uint64_t ns) {
  if (ns < kSubBuckets) return static_cast<int>(ns);
  const int octave = 63 - __builtin_clzll(ns);  // >= 3
  const int sub = static_cast<int>((ns >> (octave - 3)) & (kSubBuckets - 1));
  const int b = (octave - 2) * kSubBuckets + sub;
  return b < kBuckets ? b : kBuckets - 1;
}

/// The smallest value of bucket b (the inverse of bucket_of).
double bucket_floor_ns(int b) {
  if (b < kSubBuckets) return b;
  const int octave = b / kSubBuckets + 2;
  const int sub = b % kSubBuckets;
  return static_cast<double>((std::uint64_t{kSubBuckets} + sub) << (octave - 3));
}

struct Timing {
  const char* name;
  std::atomic<void*> next{nullptr};
  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::uint64_t> total_ns{0};
  std::atomic<std::uint64_t> max_ns{0};
  std::atomic<std::uint64_t> slow_calls{0};
  std::atomic<std::uint64_t> slow_ns{0};
  std::atomic<std::uint64_t> buckets[kBuckets]{};
};

enum Fn { kMalloc, kFree, kMallocAsync, kFreeAsync, kStreamSync, kDeviceSync, kFns };
Timing timings[kFns] = {{"cudaMalloc"},
                        {"cudaFree"},
                        {"cudaMallocAsync"},
                        {"cudaFreeAsync"},
                        {"cudaStreamSynchronize"},
                        {"cudaDeviceSynchronize"}};
std::uint64_t slow_threshold_ns = 10000;

void* find_next(const char* name) {
  if (void* f = dlsym(RTLD_NEXT, name)) return f;
  // A runtime loaded with local scope (a Python extension's dependency) is not in the global
  // scope; the application's calls still bind to this library: find it by its soname.
  for (const char* soname : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    if (void* handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD)) {
      if (void* f = dlsym(handle, name)) return f;
    }
  }
  fprintf(stderr, "call_timer: cannot find %s behind this library\n", name);
  abort();
}

template <typename F>
F next(Fn fn) {
  Timing& t = timings[fn];
  void* f = t.next.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = find_next(t.name);
    t.next.store(f, std::memory_order_release);
  }
  return reinterpret_cast<F>(f);
}

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

void record(Fn fn, std::uint64_t ns) {
  Timing& t = timings[fn];
  t.calls.fetch_add(1, std::memory_order_relaxed);
  t.total_ns.fetch_add(ns, std::memory_order_relaxed);
  t.buckets[bucket_of(ns)].fetch_add(1, std::memory_order_relaxed);
  if (ns >= slow_threshold_ns) {
    t.slow_calls.fetch_add(1, std::memory_order_relaxed);
    t.slow_ns.fetch_add(ns, std::memory_order_relaxed);
  }
  std::uint64_t seen = t.max_ns.load(std::memory_order_relaxed);
  while (ns > seen && !t.max_ns.compare_exchange_weak(seen, ns, std::memory_order_relaxed)) {
  }
}

template <typename F, typename... Args>
Error timed(Fn fn, Args... args) {
  auto f = next<F>(fn);
  const std::uint64_t start = now_ns();
  const Error e = f(args...);
  record(fn, now_ns() - start);
  return e;
}

double percentile_us(const Timing& t, std::uint64_t calls, double q) {
  const auto rank = static_cast<std::uint64_t>(q * static_cast<double>(calls - 1));
  std::uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += t.buckets[b].load(std::memory_order_relaxed);
    if (seen > rank) return bucket_floor_ns(b) / 1000.0;
  }
  return bucket_floor_ns(kBuckets - 1) / 1000.0;
}

__attribute__((constructor)) void start() {
  if (const char* text = getenv("CALL_TIMER_SLOW_US")) {
    slow_threshold_ns = static_cast<std::uint64_t>(strtod(text, nullptr) * 1000.0);
  }
}

__attribute__((destructor)) void report() {
  const char* path = getenv("CALL_TIMER_OUT");
  FILE* out = path != nullptr && path[0] != '\0' ? fopen(path, "a") : nullptr;
  FILE* to = out != nullptr ? out : stderr;
  for (const Timing& t : timings) {
    const std::uint64_t calls = t.calls.load(std::memory_order_relaxed);
    if (calls == 0) continue;
    const double total_us = static_cast<double>(t.total_ns.load(std::memory_order_relaxed)) / 1e3;
    fprintf(to,
            "call_timer: fn=%s calls=%llu total_us=%.1f mean_us=%.3f p50_us=%.3f p99_us=%.3f "
            "max_us=%.1f slow_calls=%llu slow_us=%.1f\n",
            t.name, static_cast<unsigned long long>(calls), total_us,
            total_us / static_cast<double>(calls), percentile_us(t, calls, 0.50),
            percentile_us(t, calls, 0.99),
            static_cast<double>(t.max_ns.load(std::memory_order_relaxed)) / 1e3,
            static_cast<unsigned long long>(t.slow_calls.load(std::memory_order_relaxed)),
            static_cast<double>(t.slow_ns.load(std::memory_order_relaxed)) / 1e3);
  }
  if (out != nullptr) fclose(out);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void call_timer_reset() {
  for (Timing& t : timings) {
    t.calls.store(0, std::memory_order_relaxed);
    t.total_ns.store(0, std::memory_order_relaxed);
    t.max_ns.store(0, std::memory_order_relaxed);
    t.slow_calls.store(0, std::memory_order_relaxed);
    t.slow_ns.store(0, std::memory_order_relaxed);
    for (auto& b : t.buckets) b.store(0, std::memory_order_relaxed);
  }
}

__attribute__((visibility("default"))) Error cudaMalloc(void** p, size_t n) {
  return timed<Error (*)(void**, size_t)>(kMalloc, p, n);
}
__attribute__((visibility("default"))) Error cudaFree(void* p) {
  return timed<Error (*)(void*)>(kFree, p);
}
__attribute__((visibility("default"))) Error cudaMallocAsync(void** p, size_t n, Stream s) {
  return timed<Error (*)(void**, size_t, Stream)>(kMallocAsync, p, n, s);
}
__attribute__((visibility("default"))) Error cudaFreeAsync(void* p, Stream s) {
  return timed<Error (*)(void*, Stream)>(kFreeAsync, p, s);
}
__attribute__((visibility("default"))) Error cudaStreamSynchronize(Stream s) {
  return timed<Error (*)(Stream)>(kStreamSync, s);
}
__attribute__((visibility("default"))) Error cudaDeviceSynchronize() {
  return timed<Error (*)()>(kDeviceSync);
}

}  // extern "C"
