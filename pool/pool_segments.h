// DevicePoolSegments: the segments of a device's SegmentAllocator come from its cudaMemPool
// (DESIGN §3: the pool stays underneath, stream-ordered, trimmable and capped). A segment is
// allocated on the pool's private stream and waited for, so that it is usable from every stream
// at once, as cudaMalloc's memory must be; it goes back in that stream's order once every use of
// it has completed.
#pragma once

#include "cuda_api.h"
#include "device_pool.h"
#include "segment_allocator.h"

namespace poolshim {

class DevicePoolSegments final : public SegmentSource {
 public:
  DevicePoolSegments(const DriverApi& driver, DevicePool& pool) : driver_(driver), pool_(pool) {}
  bool reserve(std::uint64_t bytes, CUdeviceptr* out) override;
  void release(CUdeviceptr base, std::uint64_t bytes) override;

 private:
  const DriverApi& driver_;
  DevicePool& pool_;
};

}  // namespace poolshim
