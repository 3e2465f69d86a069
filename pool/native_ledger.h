// NativeLedger: the books of allocations the real function served and the shim tracks (DESIGN
// §3, observe mode): every allocation in POOLSHIM_MODE=observe, and in pool mode the ones the
// pool passed to the real function that it could see the pointer of. Per device, exact live
// bytes (a cap is checked against them), their peak and count, the cap, and the context the
// background thread asks for the device's memory in. The hot path is one atomic add (a
// compare-and-swap loop under a cap): no lock, no allocation.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>

namespace poolshim {

class NativeLedger {
 public:
  static constexpr int kDevices = 64;

  /// Sets `device`'s cap in bytes (0: none), once: later calls change nothing. Returns the cap.
  std::uint64_t set_cap_once(int device, std::uint64_t cap);
  std::uint64_t cap(int device) const;
  /// Whether set_cap_once was called for `device` (true outside 0..63: nothing to set there).
  bool cap_known(int device) const;
  /// Counts `bytes` on `device` before the real call; false (nothing counted) when the live
  /// bytes would pass the cap. Concurrent admissions never pass it together.
  bool admit(int device, std::uint64_t bytes);
  /// Takes back what admit counted: the real call failed, or the allocation was freed.
  void release(int device, std::uint64_t bytes);
  /// An allocation admitted before was made (live count and peak).
  void made(int device);
  /// It was freed (count; the bytes go through release).
  void freed(int device);

  std::uint64_t live_bytes(int device) const;
  std::uint64_t peak_bytes(int device) const;
  std::uint64_t live_count(int device) const;

  /// The context current at `device`'s first tracked allocation (the first one wins).
  void note_context(int device, CUcontext context);
  CUcontext context(int device) const;
  /// cudaDeviceReset: the device's allocations and context are gone (its cap stays).
  void forget_device(int device);

 private:
  struct alignas(64) Device {
    std::atomic<std::uint64_t> live{0};
    std::atomic<std::uint64_t> peak{0};
    std::atomic<std::uint64_t> count{0};
    std::atomic<std::uint64_t> cap{0};
    std::atomic<bool> cap_set{false};
    std::atomic<CUcontext> context{nullptr};
  };
  static bool valid(int device) { return device >= 0 && device < kDevices; }

  std::array<Device, kDevices> devices_{};
};

}  // namespace poolshim
