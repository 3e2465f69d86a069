#include "pool_segments.h"

namespace poolshim {

bool DevicePoolSegments::reserve(std::uint64_t bytes, CUdeviceptr* out) {
  ScopedContext ctx(driver_, pool_.context());
  RelaxedCaptureScope relaxed(driver_);
  CUdeviceptr p = 0;
  if (driver_.cuMemAllocFromPoolAsync(&p, bytes, pool_.handle(), pool_.stream()) != CUDA_SUCCESS) {
    return false;
  }
  if (driver_.cuStreamSynchronize(pool_.stream()) != CUDA_SUCCESS) {
    driver_.cuMemFreeAsync(p, pool_.stream());
    return false;
  }
  *out = p;
  return true;
}

void DevicePoolSegments::release(CUdeviceptr base, std::uint64_t) {
  ScopedContext ctx(driver_, pool_.context());
  RelaxedCaptureScope relaxed(driver_);
  driver_.cuMemFreeAsync(base, pool_.stream());
}

}  // namespace poolshim
