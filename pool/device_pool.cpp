#include "device_pool.h"

#include <limits>

#include "pool_segments.h"

namespace poolshim {

namespace {

std::string failure(const DriverApi& driver, const char* step, CUresult r) {
  return std::string(step) + " failed: " + driver.error_name(r);
}

constexpr std::size_t kProxyBytes = 512;

}  // namespace

std::unique_ptr<DevicePool> DevicePool::create(const DriverApi& driver, int ordinal,
                                               const PoolSettings& settings, std::string* error) {
  std::unique_ptr<DevicePool> p(new DevicePool(driver, ordinal));
  CUresult r = driver.cuDeviceGet(&p->device_, ordinal);
  if (r != CUDA_SUCCESS) {
    *error = failure(driver, "cuDeviceGet", r);
    return nullptr;
  }
  std::size_t total = 0;
  if ((r = driver.cuDeviceTotalMem_v2(&total, p->device_)) != CUDA_SUCCESS) {
    *error = failure(driver, "cuDeviceTotalMem", r);
    return nullptr;
  }
  p->device_total_ = total;
  // Our own reference keeps the primary context (and so the pool) alive when the runtime
  // releases its reference during its exit teardown: the exit record can still query the pool.
  if ((r = driver.cuDevicePrimaryCtxRetain(&p->context_, p->device_)) != CUDA_SUCCESS) {
    *error = failure(driver, "cuDevicePrimaryCtxRetain", r);
    return nullptr;
  }
  p->retained_ = true;
  if ((r = driver.cuCtxPushCurrent_v2(p->context_)) != CUDA_SUCCESS) {
    *error = failure(driver, "cuCtxPushCurrent", r);
    return nullptr;
  }
  // Non-blocking, so that the legacy default stream does not serialize with our own streams.
  r = driver.cuStreamCreate(&p->stream_, CU_STREAM_NON_BLOCKING);
  if (r == CUDA_SUCCESS) r = driver.cuStreamCreate(&p->free_stream_, CU_STREAM_NON_BLOCKING);
  if (r == CUDA_SUCCESS) r = driver.cuEventCreate(&p->legacy_event_, CU_EVENT_DISABLE_TIMING);
  if (r == CUDA_SUCCESS) r = driver.cuEventCreate(&p->fence_event_, CU_EVENT_DISABLE_TIMING);
  CUcontext popped = nullptr;
  driver.cuCtxPopCurrent_v2(&popped);
  if (r != CUDA_SUCCESS) {
    *error = failure(driver, "creating the pool's streams and event", r);
    return nullptr;
  }

  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = ordinal;
  // The cap is the pool's maximum size: the driver itself refuses growth past it.
  p->cap_ = settings.cap.resolve(total);
  if (p->cap_ > 0 && p->cap_ < total) props.maxSize = p->cap_;
  if (p->cap_ >= total) p->cap_ = 0;  // a cap the device cannot reach is no cap
  p->heap_keep_ = settings.cache.resolve(total);
  if ((r = driver.cuMemPoolCreate(&p->pool_, &props)) != CUDA_SUCCESS) {
    p->pool_ = nullptr;
    *error = failure(driver, "cuMemPoolCreate", r);
    return nullptr;
  }
  // The driver would give unused memory back at every synchronization above this threshold,
  // and cudaFree synchronizes: with the default of 0 the pool would cache nothing. The shim
  // trims an idle pool itself (release_threshold, idle_trim_ms) and on out-of-memory.
  cuuint64_t keep_everything = std::numeric_limits<cuuint64_t>::max();
  int follow = settings.reuse_follow_event_deps ? 1 : 0;
  int opportunistic = settings.reuse_opportunistic ? 1 : 0;
  int internal = settings.reuse_internal_deps ? 1 : 0;
  struct {
    CUmemPool_attribute attribute;
    void* value;
    const char* name;
  } attributes[] = {
      {CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_everything, "release threshold"},
      {CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &follow, "reuse_follow_event_deps"},
      {CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &opportunistic, "reuse_opportunistic"},
      {CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &internal, "reuse_internal_deps"},
  };
  for (const auto& a : attributes) {
    if ((r = driver.cuMemPoolSetAttribute(p->pool_, a.attribute, a.value)) != CUDA_SUCCESS) {
      *error = std::string("setting the pool's ") + a.name + " failed: " + driver.error_name(r);
      return nullptr;
    }
  }
  p->source_ = std::make_unique<DevicePoolSegments>(driver, *p);
  DeviceHeap::Paging paging;
  const std::uint64_t page = settings.page.resolve(total);
  int vmm = 0;
  if (page > 0 && settings.single_device &&
      driver.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                  p->device_) == CUDA_SUCCESS &&
      vmm == 1) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    std::size_t granularity = 0;
    if (driver.cuMemGetAllocationGranularity(&granularity, &prop,
                                             CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
        granularity > 0) {
      p->pages_ = std::make_unique<DevicePoolPages>(driver, *p, ordinal, settings.ipc);
      p->page_ = (page + granularity - 1) / granularity * granularity;
      paging.physical = p->pages_.get();
      paging.page = p->page_;
      // Twice the device: blocks in use never exceed it, the free space between them may.
      paging.span = 2 * ((total + p->page_ - 1) / p->page_ * p->page_);
      paging.slack = p->heap_keep_;
    }
  }
  p->heap_ = std::make_unique<DeviceHeap>(*p->source_, paging);
  return p;
}

bool DevicePool::pages_exportable() const {
  return pages_ != nullptr && pages_->exportable();
}

DevicePool::DevicePool(const DriverApi& driver, int ordinal) : driver_(driver), ordinal_(ordinal) {}

DevicePool::~DevicePool() {
  release();
}

void DevicePool::release() {
  // The pages go while the context is alive (the heap forgets its blocks below).
  if (heap_) heap_->release_pages();
  // A pool with live allocations is released by the driver once they are freed (or by the
  // reset that follows); see cuMemPoolDestroy.
  if (pool_ != nullptr) driver_.cuMemPoolDestroy(pool_);
  if (stream_ != nullptr) driver_.cuStreamDestroy_v2(stream_);
  if (free_stream_ != nullptr) driver_.cuStreamDestroy_v2(free_stream_);
  if (legacy_event_ != nullptr) driver_.cuEventDestroy_v2(legacy_event_);
  if (fence_event_ != nullptr) driver_.cuEventDestroy_v2(fence_event_);
  // The proxy is freed by the reset that follows, or with the context at exit.
  proxy_.store(0, std::memory_order_release);
  if (retained_) driver_.cuDevicePrimaryCtxRelease_v2(device_);
  pool_ = nullptr;
  stream_ = nullptr;
  free_stream_ = nullptr;
  legacy_event_ = nullptr;
  fence_event_ = nullptr;
  retained_ = false;
  // The pool's memory is gone with it (the reset that follows frees it): so are the heap's
  // segments.
  if (heap_) heap_->clear();
  if (source_) source_->clear();
}

bool DevicePool::is_segment_base(CUdeviceptr ptr) const {
  return source_ != nullptr && source_->is_base(ptr);
}

void DevicePool::renew_proxy() {
  ScopedContext ctx(driver_, context_);
  RelaxedCaptureScope relaxed(driver_);  // a capture may be in progress on another thread
  CUdeviceptr proxy = 0;
  if (driver_.cuMemAlloc_v2(&proxy, kProxyBytes) != CUDA_SUCCESS) proxy = 0;
  proxy_.store(proxy, std::memory_order_release);
}

bool DevicePool::attribute(CUmemPool_attribute attribute, std::uint64_t* out) const {
  cuuint64_t v = 0;
  if (pool_ == nullptr || driver_.cuMemPoolGetAttribute(pool_, attribute, &v) != CUDA_SUCCESS) {
    return false;
  }
  *out = v;
  return true;
}

PoolUsage DevicePool::usage() const {
  PoolUsage u;
  u.valid = attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &u.reserved) &&
            attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &u.reserved_high) &&
            attribute(CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &u.used) &&
            attribute(CU_MEMPOOL_ATTR_USED_MEM_HIGH, &u.used_high);
  if (u.valid && heap_ && heap_->paged()) {
    // The pages' memory, mapped or about to be destroyed, as the device counts it (lock-free:
    // cudaMemGetInfo and the samples never wait for a trim that destroys pages).
    std::uint64_t peak = 0;
    const std::uint64_t held = heap_->pages_held(&peak);
    u.reserved += held;
    u.used += held;
    u.reserved_high += peak;
    u.used_high += peak;
  }
  return u;
}

std::uint64_t DevicePool::pages_held() const {
  return pages_ ? pages_->held() : 0;
}

std::uint64_t DevicePool::reserved() const {
  std::uint64_t v = 0;
  return attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) ? v : 0;
}

std::uint64_t DevicePool::trim_to(std::uint64_t keep_reserved) const {
  const PoolUsage before = usage();
  if (!before.valid || driver_.cuMemPoolTrimTo(pool_, keep_reserved) != CUDA_SUCCESS) return 0;
  const PoolUsage after = usage();
  return after.valid && after.reserved < before.reserved ? before.reserved - after.reserved : 0;
}

}  // namespace poolshim
