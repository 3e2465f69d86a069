// A SegmentSource for the heap's unit tests: segments at addresses from a counter (each 2 MiB
// aligned, a gap after each), with a budget, and a record of what was reserved and released.
#pragma once

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "segment_allocator.h"

namespace poolshim::testing {

struct CountingSource : SegmentSource {
  CUdeviceptr next = 0x10000000;
  std::uint64_t budget = ~0ULL;  // bytes it may still reserve
  std::vector<std::pair<CUdeviceptr, std::uint64_t>> reserved;
  std::vector<std::pair<CUdeviceptr, std::uint64_t>> released;
  std::mutex mutex;  // arenas reserve from one source at once, as from the driver's pool
  bool reserve(std::uint64_t bytes, CUdeviceptr* out, CUresult* why) override {
    std::lock_guard<std::mutex> lock(mutex);
    if (bytes > budget) {
      *why = CUDA_ERROR_OUT_OF_MEMORY;
      return false;
    }
    budget -= bytes;
    *out = next;
    reserved.emplace_back(next, bytes);
    next +=
        (bytes + (std::uint64_t{4} << 20)) / (std::uint64_t{2} << 20) * (std::uint64_t{2} << 20);
    return true;
  }
  void release(CUdeviceptr base, std::uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex);
    released.emplace_back(base, bytes);
  }
};

}  // namespace poolshim::testing
