#include "pool_segments.h"

#include "device_pool.h"

namespace poolshim {

bool DevicePoolSegments::reserve(std::uint64_t bytes, CUdeviceptr* out, CUresult* why) {
  // The cap covers the pages too (the pool's own maximum size cannot see them).
  if (pool_.cap() > 0 && pool_.pages_held() > 0 &&
      pool_.pages_held() + pool_.reserved() + bytes > pool_.cap()) {
    *why = CUDA_ERROR_OUT_OF_MEMORY;
    return false;
  }
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

DevicePoolPages::DevicePoolPages(const DriverApi& driver, DevicePool& pool, int ordinal,
                                 bool exportable)
    : driver_(driver), pool_(pool), exportable_(exportable) {
  prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop_.location.id = ordinal;
  access_.location = prop_.location;
  access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

CUresult DevicePoolPages::reserve(std::uint64_t bytes, CUdeviceptr* out) {
  ScopedContext ctx(driver_, pool_.context());
  return driver_.cuMemAddressReserve(out, bytes, 0, 0, 0);
}

void DevicePoolPages::unreserve(CUdeviceptr base, std::uint64_t bytes) {
  ScopedContext ctx(driver_, pool_.context());
  driver_.cuMemAddressFree(base, bytes);
}

CUresult DevicePoolPages::create(std::uint64_t bytes, CUmemGenericAllocationHandle* out) {
  if (pool_.cap() > 0 && held() + pool_.reserved() + bytes > pool_.cap()) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ScopedContext ctx(driver_, pool_.context());
  CUmemAllocationProp prop = prop_;
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  if (exportable()) {
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    r = driver_.cuMemCreate(out, bytes, &prop, 0);
    // A device or driver without that handle type: pages that cannot travel, from now on.
    if (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE) {
      exportable_.store(false, std::memory_order_relaxed);
    }
  }
  if (!exportable()) r = driver_.cuMemCreate(out, bytes, &prop_, 0);
  if (r == CUDA_SUCCESS) held_.fetch_add(bytes, std::memory_order_relaxed);
  return r;
}

void DevicePoolPages::destroy(CUmemGenericAllocationHandle handle, std::uint64_t bytes) {
  ScopedContext ctx(driver_, pool_.context());
  if (driver_.cuMemRelease(handle) == CUDA_SUCCESS) {
    held_.fetch_sub(bytes, std::memory_order_relaxed);
  }
}

CUresult DevicePoolPages::map(CUdeviceptr va, std::uint64_t bytes, CUmemGenericAllocationHandle h) {
  ScopedContext ctx(driver_, pool_.context());
  CUresult r = driver_.cuMemMap(va, bytes, 0, h, 0);
  if (r != CUDA_SUCCESS) return r;
  r = driver_.cuMemSetAccess(va, bytes, &access_, 1);
  if (r != CUDA_SUCCESS) driver_.cuMemUnmap(va, bytes);
  return r;
}

void DevicePoolPages::unmap(CUdeviceptr va, std::uint64_t bytes) {
  ScopedContext ctx(driver_, pool_.context());
  driver_.cuMemUnmap(va, bytes);
}

}  // namespace poolshim
