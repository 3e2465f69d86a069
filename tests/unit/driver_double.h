// Test fixture: the CPU driver double loaded as the core's driver, reset to known figures.
#pragma once

#include <dlfcn.h>

#include <catch2/catch.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_api.h"
#include "cudadouble.h"
#include "router.h"

namespace poolshim::testing {

constexpr std::uint64_t MiB = 1ULL << 20;

class DriverDouble {
 public:
  DriverDouble(int devices, std::size_t capacity) {
    handle_ = dlopen(POOLSHIM_DOUBLE_DRIVER, RTLD_NOW | RTLD_LOCAL);
    REQUIRE(handle_ != nullptr);
    reset_ = reinterpret_cast<decltype(reset_)>(dlsym(handle_, "cudadouble_reset"));
    stats_ = reinterpret_cast<decltype(stats_)>(dlsym(handle_, "cudadouble_device_stats"));
    calls_ = reinterpret_cast<decltype(calls_)>(dlsym(handle_, "cudadouble_call_count"));
    REQUIRE(reset_ != nullptr);
    REQUIRE(stats_ != nullptr);
    REQUIRE(calls_ != nullptr);
    reset_(devices, capacity);
    const std::string error =
        api.load(POOLSHIM_DOUBLE_DRIVER, [](void* h, const char* n) { return dlsym(h, n); });
    REQUIRE(error.empty());
  }
  ~DriverDouble() { dlclose(handle_); }
  DriverDouble(const DriverDouble&) = delete;
  DriverDouble& operator=(const DriverDouble&) = delete;

  struct cudadouble_device_stats device(int ordinal) const {
    struct cudadouble_device_stats s {};
    REQUIRE(stats_(ordinal, &s) == 0);
    return s;
  }
  unsigned long long calls(const char* name) const { return calls_(name); }
  /// A kernel faults: the double's sticky error (cudadouble_fault).
  void fault() const { function<void()>("cudadouble_fault")(); }
  /// A function of the double the core never calls (say cuStreamBeginCapture_v2), by name.
  template <typename F>
  F* function(const char* name) const {
    auto* f = reinterpret_cast<F*>(dlsym(handle_, name));
    REQUIRE(f != nullptr);
    return f;
  }
  /// Makes `ordinal`'s primary context current on this thread (as a runtime call would).
  CUcontext make_current(int ordinal) const {
    CUdevice dev = 0;
    REQUIRE(api.cuDeviceGet(&dev, ordinal) == CUDA_SUCCESS);
    CUcontext ctx = nullptr;
    REQUIRE(api.cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
    REQUIRE(api.cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    return ctx;
  }
  template <typename F>
  F symbol(const char* name) const {
    auto f = reinterpret_cast<F>(dlsym(handle_, name));
    REQUIRE(f != nullptr);
    return f;
  }

  DriverApi api;

 private:
  void* handle_ = nullptr;
  void (*reset_)(int, std::size_t) = nullptr;
  int (*stats_)(int, struct cudadouble_device_stats*) = nullptr;
  unsigned long long (*calls_)(const char*) = nullptr;
};

/// One router over a driver double; tests bind its parts by name:
/// `auto& [d, config, events, router] = rig;`.
struct Rig {
  DriverDouble d;
  Config config;
  EventQueue events;
  Router router;
  Rig(int devices, std::size_t bytes_each, Config c = Config::defaults())
      : d(devices, bytes_each), config(std::move(c)), router(d.api, config, events) {}
};

/// Calls a stand-in for the real allocation function, with the size asked when it takes one,
/// and where the address it serves goes when it takes that too (else the address is 0).
template <typename F>
RealResult call_real(F& real, std::size_t bytes, CUdeviceptr* native) {
  if constexpr (std::is_invocable_v<F&, std::size_t, CUdeviceptr*>) {
    return real(bytes, native);
  } else if constexpr (std::is_invocable_v<F&, std::size_t>) {
    *native = 0;
    return real(bytes);
  } else {
    *native = 0;
    return real();
  }
}

/// Router::allocate_sync with the pointer as a void* (nullptr when the real function ran).
template <typename F>
void* sync_alloc(Router& router, int device, std::size_t bytes, F&& real) {
  CUdeviceptr p = 0;
  auto adapt = [&](std::size_t n, CUdeviceptr* native) { return call_real(real, n, native); };
  return router.allocate_sync(device, bytes, &p, adapt) ? reinterpret_cast<void*>(p) : nullptr;
}

template <typename F>
void* async_alloc(Router& router, int device, std::size_t bytes, CUstream stream, F&& real) {
  CUdeviceptr p = 0;
  auto adapt = [&](std::size_t n, CUdeviceptr* native) { return call_real(real, n, native); };
  return router.allocate_async(device, bytes, stream, &p, adapt) ? reinterpret_cast<void*>(p)
                                                                 : nullptr;
}

// Stands in for the real runtime function behind a hook: counts calls, answers `result`.
struct RealStub {
  RealResult result = RealResult::success;
  int calls = 0;
  std::size_t last_request = 0;
  RealResult operator()() {
    ++calls;
    return result;
  }
  // A real allocation: on success it "serves" an address of its own (counting up from
  // native_next in 1 MiB steps), which the core may track.
  CUdeviceptr native_next = CUdeviceptr{0x7f0000000000};
  RealResult operator()(std::size_t bytes, CUdeviceptr* native) {
    last_request = bytes;
    const RealResult r = (*this)();
    *native = r == RealResult::success ? (native_next += CUdeviceptr{1} << 20) : 0;
    return r;
  }
  void* last_pointer = nullptr;  // what a real free was called for
  RealResult operator()(void* ptr) {
    last_pointer = ptr;
    return (*this)();
  }
};

inline Config ordered_config() {
  Config c = Config::defaults();
  c.free = "ordered";
  return c;
}

// The pool's own behaviour, without the user-space cache in front of it.
inline Config without_cache(Config c = Config::defaults()) {
  c.cache = SizeValue{};
  return c;
}

// Large blocks from segments of the pool, not from the paged arenas (page = 0): the tests of the
// segment path's exact figures.
inline Config with_segments(Config c = Config::defaults()) {
  c.page = SizeValue{};
  return c;
}

inline std::vector<Event> drain(EventQueue& q) {
  std::vector<Event> out;
  q.drain(out);
  return out;
}

}  // namespace poolshim::testing
