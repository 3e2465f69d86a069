// DevicePoolSegments: the segments of a device's SegmentAllocator come from its cudaMemPool
// (DESIGN §3: the pool stays underneath, stream-ordered, trimmable and capped). A segment is
// allocated on the pool's private stream and waited for, so that it is usable from every stream
// at once, as cudaMalloc's memory must be; it goes back in that stream's order once every use of
// it has completed. The segments' base addresses are kept (a sharded table, no process-wide lock):
// a free of a base the pool no longer hands out (a double free of a segment's first block) must
// never reach the real free function, which would free the whole segment under its live blocks.
#pragma once

#include <atomic>

#include "allocation_table.h"
#include "cuda_api.h"
#include "page_map.h"
#include "segment_allocator.h"

namespace poolshim {

class DevicePool;

class DevicePoolSegments final : public SegmentSource {
 public:
  DevicePoolSegments(const DriverApi& driver, DevicePool& pool) : driver_(driver), pool_(pool) {}
  bool reserve(std::uint64_t bytes, CUdeviceptr* out, CUresult* why) override;
  void release(CUdeviceptr base, std::uint64_t bytes) override;
  /// Whether `ptr` is the base address of a segment held now.
  bool is_base(CUdeviceptr ptr) const { return bases_.find(ptr).has_value(); }
  /// Forgets every base (the device was reset).
  void clear() {
    bases_.drop_device(-1, [](std::uintptr_t, const Allocation&) {});
  }

 private:
  const DriverApi& driver_;
  DevicePool& pool_;
  AllocationTable bases_;  // base -> {size}; device -1
};

/// The pages of a device's paged large arenas (page_map.h): physical memory from cuMemCreate,
/// mapped with cuMemMap and cuMemSetAccess in ranges from cuMemAddressReserve. The pool's cap
/// covers the pages and the pool's own memory together. `exportable`: pages are made with the
/// POSIX descriptor handle type, so that legacy IPC can export blocks over them (ipc_share.h);
/// where the device refuses that type, without it (exportable() then turns false).
class DevicePoolPages final : public PhysicalMemory {
 public:
  DevicePoolPages(const DriverApi& driver, DevicePool& pool, int ordinal, bool exportable);
  CUresult reserve(std::uint64_t bytes, CUdeviceptr* out) override;
  void unreserve(CUdeviceptr base, std::uint64_t bytes) override;
  CUresult create(std::uint64_t bytes, CUmemGenericAllocationHandle* out) override;
  void destroy(CUmemGenericAllocationHandle handle, std::uint64_t bytes) override;
  CUresult map(CUdeviceptr va, std::uint64_t bytes, CUmemGenericAllocationHandle h) override;
  void unmap(CUdeviceptr va, std::uint64_t bytes) override;
  /// Physical bytes made and not yet destroyed.
  std::uint64_t held() const { return held_.load(std::memory_order_relaxed); }
  bool exportable() const { return exportable_.load(std::memory_order_relaxed); }

 private:
  const DriverApi& driver_;
  DevicePool& pool_;
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
  std::atomic<std::uint64_t> held_{0};
  std::atomic<bool> exportable_{false};
};

}  // namespace poolshim
