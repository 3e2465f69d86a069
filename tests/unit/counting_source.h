// A SegmentSource for the heap's unit tests: segments at addresses from a counter (each 2 MiB
// aligned, a gap after each), with a budget, and a record of what was reserved and released.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "page_map.h"
#include "segment_allocator.h"

namespace poolshim::testing {

/// A block of `bytes` from `a` for stream token `affinity` (fences up to `completed` done),
/// which the test requires to be served.
inline SegmentAllocator::Block take(SegmentAllocator& a, std::uint64_t bytes,
                                    std::uintptr_t affinity = 0, std::uint64_t completed = 0) {
  SegmentAllocator::Block b;
  REQUIRE(a.allocate(bytes, affinity, completed, &b));
  return b;
}

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

namespace poolshim::testing {

/// A PhysicalMemory for the page map's tests: addresses from a counter, handles numbered, a
/// budget for physical bytes, and a record of every call.
struct CountingPhysical : PhysicalMemory {
  CUdeviceptr next_va = 0x100000000;
  std::uint64_t budget = ~0ULL;  // physical bytes it may still make
  std::uint64_t held = 0;
  std::uint64_t held_peak = 0;
  CUmemGenericAllocationHandle next_handle = 1;
  std::vector<std::pair<CUdeviceptr, std::uint64_t>> reserved;
  std::vector<std::pair<CUdeviceptr, std::uint64_t>> unreserved;
  std::vector<CUmemGenericAllocationHandle> created;
  std::vector<CUmemGenericAllocationHandle> destroyed;
  std::vector<std::pair<CUdeviceptr, CUmemGenericAllocationHandle>> maps;
  std::vector<CUdeviceptr> unmaps;
  std::mutex mutex;
  CUresult reserve(std::uint64_t bytes, CUdeviceptr* out) override {
    std::lock_guard<std::mutex> lock(mutex);
    *out = next_va;
    reserved.emplace_back(next_va, bytes);
    next_va += bytes + (std::uint64_t{1} << 30);
    return CUDA_SUCCESS;
  }
  void unreserve(CUdeviceptr base, std::uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex);
    unreserved.emplace_back(base, bytes);
  }
  CUresult create(std::uint64_t bytes, CUmemGenericAllocationHandle* out) override {
    std::lock_guard<std::mutex> lock(mutex);
    if (bytes > budget) return CUDA_ERROR_OUT_OF_MEMORY;
    budget -= bytes;
    held += bytes;
    held_peak = std::max(held_peak, held);
    *out = next_handle++;
    created.push_back(*out);
    return CUDA_SUCCESS;
  }
  void destroy(CUmemGenericAllocationHandle h, std::uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex);
    held -= bytes;
    budget += bytes;
    destroyed.push_back(h);
  }
  CUresult map(CUdeviceptr va, std::uint64_t, CUmemGenericAllocationHandle h) override {
    std::lock_guard<std::mutex> lock(mutex);
    maps.emplace_back(va, h);
    return CUDA_SUCCESS;
  }
  void unmap(CUdeviceptr va, std::uint64_t) override {
    std::lock_guard<std::mutex> lock(mutex);
    unmaps.push_back(va);
  }
};

}  // namespace poolshim::testing
