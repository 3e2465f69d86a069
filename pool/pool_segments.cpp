#include "pool_segments.h"

#include "device_pool.h"

namespace poolshim {

bool DevicePoolSegments::reserve(std::uint64_t bytes, CUdeviceptr* out, CUresult* why) {
  ScopedContext ctx(driver_, pool_.context());
  RelaxedCaptureScope relaxed(driver_);
  CUdeviceptr p = 0;
  *why = driver_.cuMemAllocFromPoolAsync(&p, bytes, pool_.handle(), pool_.stream());
  if (*why != CUDA_SUCCESS) return false;
  if ((*why = driver_.cuStreamSynchronize(pool_.stream())) != CUDA_SUCCESS) {
    driver_.cuMemFreeAsync(p, pool_.stream());
    return false;
  }
  *out = p;
  Allocation a;
  a.capacity = bytes;
  bases_.insert(p, a);
  return true;
}

void DevicePoolSegments::release(CUdeviceptr base, std::uint64_t) {
  bases_.take(base);
  ScopedContext ctx(driver_, pool_.context());
  RelaxedCaptureScope relaxed(driver_);
  driver_.cuMemFreeAsync(base, pool_.stream());
}

}  // namespace poolshim
