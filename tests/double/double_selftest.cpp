// Tests of the CUDA test double itself: the figures the project's tests rely on (cudadouble.h).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "cudadouble.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

// Per-thread default stream entry points; the headers declare them only for programs built
// with --default-stream per-thread.
extern "C" {
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream);
cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t stream);
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream);
}

namespace {

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;

// Fresh driver with `devices` devices, initialised, device 0's primary context current.
CUcontext startDriver(int devices = 1, size_t capacity = 64 * MiB) {
  cudadouble_reset(devices, capacity);
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  return ctx;
}

cudadouble_device_stats_t stats(int device = 0) {
  cudadouble_device_stats_t s{};
  REQUIRE(cudadouble_device_stats(device, &s) == 0);
  return s;
}

CUmemoryPool createPool(int device = 0) {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = device;
  CUmemoryPool pool = nullptr;
  REQUIRE(cuMemPoolCreate(&pool, &props) == CUDA_SUCCESS);
  return pool;
}

cuuint64_t attribute(CUmemoryPool pool, CUmemPool_attribute which) {
  cuuint64_t value = 0;
  REQUIRE(cuMemPoolGetAttribute(pool, which, &value) == CUDA_SUCCESS);
  return value;
}

size_t reserved(CUmemoryPool pool) {
  return attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
}
size_t used(CUmemoryPool pool) {
  return attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
}

void setThreshold(CUmemoryPool pool, cuuint64_t bytes) {
  REQUIRE(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &bytes) == CUDA_SUCCESS);
}

CUdeviceptr allocate(CUmemoryPool pool, size_t bytes, CUstream stream) {
  CUdeviceptr p = 0;
  REQUIRE(cuMemAllocFromPoolAsync(&p, bytes, pool, stream) == CUDA_SUCCESS);
  return p;
}

CUstream createStream() {
  CUstream stream = nullptr;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  return stream;
}

void* driverSymbol(const char* name) {
  void* handle = dlopen(CUDADOUBLE_DRIVER_PATH, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(handle != nullptr);
  void* symbol = dlsym(handle, name);
  dlclose(handle);
  return symbol;
}

struct Resolved {
  CUresult result;
  void* function;
  CUdriverProcAddressQueryResult status;
};

Resolved resolve(const char* symbol, int version, cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT) {
  Resolved r{CUDA_SUCCESS, reinterpret_cast<void*>(1), CU_GET_PROC_ADDRESS_SUCCESS};
  r.result = cuGetProcAddress(symbol, &r.function, version, flags, &r.status);
  return r;
}

// Fresh driver, runtime on device 0 with no error pending.
void startRuntime(int devices = 1, size_t capacity = 64 * MiB) {
  cudadouble_reset(devices, capacity);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaGetLastError();
}

}  // namespace

// ================================ initialisation and devices ===================================

TEST_CASE("driver calls before cuInit return CUDA_ERROR_NOT_INITIALIZED") {
  cudadouble_reset(1, 64 * MiB);
  int count = 0;
  CHECK(cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED);
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 1000) == CUDA_ERROR_NOT_INITIALIZED);

  int version = 0;
  CHECK(cuDriverGetVersion(&version) == CUDA_SUCCESS);
  CHECK(version == 13000);
  const char* name = nullptr;
  CHECK(cuGetErrorName(CUDA_ERROR_NOT_INITIALIZED, &name) == CUDA_SUCCESS);
  CHECK(std::string(name) == "CUDA_ERROR_NOT_INITIALIZED");
  CHECK(resolve("cuMemAlloc", 3020).result == CUDA_SUCCESS);

  CHECK(cuInit(0) == CUDA_SUCCESS);
  CHECK(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  CHECK(count == 1);
}

TEST_CASE("device queries report the configured devices") {
  startDriver(2, 3 * (size_t{1} << 30));
  int count = 0;
  REQUIRE(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  CHECK(count == 2);

  CUdevice device = -1;
  CHECK(cuDeviceGet(&device, 1) == CUDA_SUCCESS);
  CHECK(device == 1);
  CHECK(cuDeviceGet(&device, 2) == CUDA_ERROR_INVALID_DEVICE);

  char name[128];
  REQUIRE(cuDeviceGetName(name, sizeof name, 1) == CUDA_SUCCESS);
  CHECK(std::string(name) == "poolshim CPU test double, device 1");

  size_t total = 0;
  REQUIRE(cuDeviceTotalMem(&total, 1) == CUDA_SUCCESS);
  CHECK(total == 3 * (size_t{1} << 30));

  auto attributeOf = [](CUdevice_attribute which) {
    int value = -1;
    REQUIRE(cuDeviceGetAttribute(&value, which, 0) == CUDA_SUCCESS);
    return value;
  };
  CHECK(attributeOf(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) == 9);
  CHECK(attributeOf(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) == 0);
  CHECK(attributeOf(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) == 132);
  CHECK(attributeOf(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 1);
  CHECK(attributeOf(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) == 1);
  int value = 0;
  CHECK(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 0) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 5) ==
        CUDA_ERROR_INVALID_DEVICE);
}

TEST_CASE("calls that need a context fail without a current one") {
  cudadouble_reset(1, 64 * MiB);
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 1000) == CUDA_ERROR_INVALID_CONTEXT);
  CUstream stream = nullptr;
  CHECK(cuStreamCreate(&stream, 0) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cuStreamSynchronize(nullptr) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cuCtxSynchronize() == CUDA_ERROR_INVALID_CONTEXT);
  size_t free = 0;
  size_t total = 0;
  CHECK(cuMemGetInfo(&free, &total) == CUDA_ERROR_INVALID_CONTEXT);
}

TEST_CASE("the context stack is per thread") {
  startDriver(2);
  CUcontext ctx1 = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx1, 1) == CUDA_SUCCESS);
  REQUIRE(cuCtxPushCurrent(ctx1) == CUDA_SUCCESS);
  CUdevice device = -1;
  CHECK(cuCtxGetDevice(&device) == CUDA_SUCCESS);
  CHECK(device == 1);

  CUcontext other_thread_ctx = ctx1;
  std::thread([&] { cuCtxGetCurrent(&other_thread_ctx); }).join();
  CHECK(other_thread_ctx == nullptr);

  CUcontext popped = nullptr;
  CHECK(cuCtxPopCurrent(&popped) == CUDA_SUCCESS);
  CHECK(popped == ctx1);
  CHECK(cuCtxGetDevice(&device) == CUDA_SUCCESS);
  CHECK(device == 0);

  unsigned flags = 0;
  int active = 0;
  REQUIRE(cuDevicePrimaryCtxGetState(1, &flags, &active) == CUDA_SUCCESS);
  CHECK(active == 1);
}

// ================================ plain allocations ============================================

TEST_CASE("a plain allocation is rounded up to 512 bytes and counts toward consumption") {
  startDriver(1, 64 * MiB);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
  auto s = stats();
  CHECK(s.plain_count == 1);
  CHECK(s.plain_bytes == 1024);
  CHECK(s.consumption == 1024);
  size_t free = 0;
  size_t total = 0;
  REQUIRE(cuMemGetInfo(&free, &total) == CUDA_SUCCESS);
  CHECK(total == 64 * MiB);
  CHECK(free == 64 * MiB - 1024);

  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  CHECK(stats().consumption == 0);
  CHECK(stats().plain_count == 0);
}

TEST_CASE("a plain allocation over capacity fails and changes nothing") {
  startDriver(1, 4 * MiB);
  CUdeviceptr a = 0;
  REQUIRE(cuMemAlloc(&a, 3 * MiB) == CUDA_SUCCESS);
  CUdeviceptr b = 0;
  CHECK(cuMemAlloc(&b, 2 * MiB) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(stats().consumption == 3 * MiB);
  CHECK(stats().plain_count == 1);
  CHECK(cuMemAlloc(&b, 1 * MiB) == CUDA_SUCCESS);
  CHECK(stats().consumption == 4 * MiB);
}

TEST_CASE("cuMemAlloc rejects size 0 and a null out-pointer") {
  startDriver();
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAlloc(nullptr, 1000) == CUDA_ERROR_INVALID_VALUE);
  CHECK(stats().plain_count == 0);
}

TEST_CASE("cuMemFree accepts 0 and rejects what is not the start of a live allocation") {
  startDriver();
  CHECK(cuMemFree(0) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
  CHECK(cuMemFree(p + 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree(p) == CUDA_SUCCESS);
  CHECK(cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("host allocations are tracked so cuMemFreeHost can validate them") {
  startDriver();
  void* host = nullptr;
  REQUIRE(cuMemAllocHost(&host, 100) == CUDA_SUCCESS);
  unsigned int type = 0;
  REQUIRE(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                reinterpret_cast<CUdeviceptr>(host)) == CUDA_SUCCESS);
  CHECK(type == CU_MEMORYTYPE_HOST);
  CHECK(cuMemFreeHost(static_cast<char*>(host) + 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFreeHost(host) == CUDA_SUCCESS);
  CHECK(cuMemFreeHost(host) == CUDA_ERROR_INVALID_VALUE);
  CHECK(stats().consumption == 0);
}

// ================================ memory pools =================================================

TEST_CASE("a 1000-byte pool allocation uses 1024 bytes and reserves one 2 MiB chunk") {
  startDriver();
  CUmemoryPool pool = createPool();
  CHECK(stats().pool_count == 1);
  CUdeviceptr p = allocate(pool, 1000, nullptr);
  CHECK(p != 0);
  CHECK(used(pool) == 1024);
  CHECK(reserved(pool) == 2 * MiB);
  CHECK(stats().consumption == 2 * MiB);
  CHECK(attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 1024);
  CHECK(attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 2 * MiB);
}

TEST_CASE("a 3 MiB pool allocation reserves a 4 MiB chunk of its own") {
  startDriver();
  CUmemoryPool pool = createPool();
  allocate(pool, 1000, nullptr);
  allocate(pool, 3 * MiB, nullptr);
  CHECK(reserved(pool) == 6 * MiB);
  CHECK(used(pool) == 1024 + 3 * MiB);
}

TEST_CASE("pool blocks never span chunks") {
  startDriver();
  CUmemoryPool pool = createPool();
  CUdeviceptr a = allocate(pool, 1000, nullptr);
  CUdeviceptr b = allocate(pool, 2 * MiB, nullptr);
  CHECK(reserved(pool) == 4 * MiB);
  // The second chunk holds b alone: the 2 MiB - 1024 left in the first does not fit it.
  CHECK((b < a || b >= a + 2 * MiB));
}

TEST_CASE("pool placement is first fit and freed neighbours coalesce") {
  startDriver();
  CUmemoryPool pool = createPool();
  CUdeviceptr a = allocate(pool, 1000, nullptr);
  CUdeviceptr b = allocate(pool, 1000, nullptr);
  CUdeviceptr c = allocate(pool, 1000, nullptr);
  CHECK(b == a + 1024);
  CHECK(c == a + 2048);

  REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
  CHECK(allocate(pool, 512, nullptr) == a);  // first hole in address order
  REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(b) == CUDA_SUCCESS);
  CHECK(allocate(pool, 2048, nullptr) == a);  // only fits in a and b merged
  CHECK(used(pool) == 3072);
  CHECK(reserved(pool) == 2 * MiB);
}

TEST_CASE("a pending free is reused only by its own stream until that stream is synchronized") {
  startDriver();
  CUmemoryPool pool = createPool();
  CUstream s1 = createStream();
  CUstream s2 = createStream();

  CUdeviceptr a = allocate(pool, 1 * MiB, s1);
  REQUIRE(cuMemFreeAsync(a, s1) == CUDA_SUCCESS);
  CHECK(stats().pending_free_count == 1);
  CHECK(used(pool) == 0);

  CUdeviceptr b = allocate(pool, 1 * MiB, s2);
  CHECK(b == a + 1 * MiB);  // s2 may not touch a yet
  CUdeviceptr c = allocate(pool, 1 * MiB, s1);
  CHECK(c == a);  // stream order makes a safe for s1
  CHECK(stats().pending_free_count == 0);
  CHECK(reserved(pool) == 2 * MiB);

  REQUIRE(cuMemFreeAsync(c, s1) == CUDA_SUCCESS);
  CUdeviceptr d = allocate(pool, 1 * MiB, s2);
  CHECK(reserved(pool) == 4 * MiB);  // the pending range was not usable, so a chunk was added
  REQUIRE(cuStreamSynchronize(s1) == CUDA_SUCCESS);
  CHECK(stats().pending_free_count == 0);
  CHECK(allocate(pool, 1 * MiB, s2) == a);
  CHECK(d != a);
}

TEST_CASE("a pending free larger than the request is split and the rest stays pending") {
  startDriver();
  CUmemoryPool pool = createPool();
  CUstream s1 = createStream();
  CUstream s2 = createStream();
  CUdeviceptr a = allocate(pool, 1 * MiB, s1);
  REQUIRE(cuMemFreeAsync(a, s1) == CUDA_SUCCESS);

  CHECK(allocate(pool, 256 * KiB, s1) == a);
  CHECK(stats().pending_free_count == 1);
  CHECK(allocate(pool, 256 * KiB, s2) == a + 1 * MiB);
  CHECK(allocate(pool, 768 * KiB, s1) == a + 256 * KiB);
  CHECK(stats().pending_free_count == 0);
}

TEST_CASE("synchronizing a stream settles only that stream's pending frees") {
  startDriver();
  CUmemoryPool pool = createPool();
  CUstream s1 = createStream();
  CUstream s2 = createStream();
  CUdeviceptr a = allocate(pool, 2 * MiB, s1);
  REQUIRE(cuMemFreeAsync(a, s1) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s2) == CUDA_SUCCESS);
  CHECK(stats().pending_free_count == 1);
  CHECK(reserved(pool) == 2 * MiB);
  REQUIRE(cuStreamSynchronize(s1) == CUDA_SUCCESS);
  CHECK(stats().pending_free_count == 0);
  CHECK(reserved(pool) == 0);  // release threshold 0
}

TEST_CASE(
    "synchronization releases fully free chunks, newest first, down to the release threshold") {
  startDriver();
  CUmemoryPool pool = createPool();
  CUstream s = createStream();
  CUdeviceptr a = allocate(pool, 2 * MiB, s);
  CUdeviceptr b = allocate(pool, 2 * MiB, s);
  CUdeviceptr c = allocate(pool, 2 * MiB, s);
  CHECK(reserved(pool) == 6 * MiB);
  setThreshold(pool, 3 * MiB);
  for (CUdeviceptr p : {a, b, c}) REQUIRE(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  CHECK(reserved(pool) == 6 * MiB);  // nothing is released before a synchronization

  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(reserved(pool) == 4 * MiB);  // 6 - 2 >= 3 released c's chunk; 4 - 2 < 3 kept the rest
  CHECK(stats().consumption == 4 * MiB);
  // The oldest chunks stay: a fits where it was.
  CHECK(allocate(pool, 2 * MiB, s) == a);

  setThreshold(pool, 0);
  REQUIRE(cuMemFreeAsync(a, s) == CUDA_SUCCESS);
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK(reserved(pool) == 0);
  CHECK(stats().consumption == 0);
}

TEST_CASE("a chunk with live allocations is never released") {
  startDriver();
  CUmemoryPool pool = createPool();
  CUdeviceptr a = allocate(pool, 1000, nullptr);
  CUdeviceptr b = allocate(pool, 1000, nullptr);
  REQUIRE(cuMemFreeAsync(a, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  REQUIRE(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS);
  CHECK(reserved(pool) == 2 * MiB);
  REQUIRE(cuMemFree(b) == CUDA_SUCCESS);
  REQUIRE(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS);
  CHECK(reserved(pool) == 0);
}

TEST_CASE("cuMemPoolTrimTo settles pending frees and releases while reserved >= minBytesToKeep") {
  startDriver();
  CUmemoryPool pool = createPool();
  CUstream s = createStream();
  setThreshold(pool, 64 * MiB);
  std::vector<CUdeviceptr> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(allocate(pool, 2 * MiB, s));
  for (CUdeviceptr p : blocks) REQUIRE(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  CHECK(stats().pending_free_count == 3);

  REQUIRE(cuMemPoolTrimTo(pool, 3 * MiB) == CUDA_SUCCESS);
  CHECK(stats().pending_free_count == 0);
  CHECK(reserved(pool) == 2 * MiB);  // 6 >= 3 and 4 >= 3 released; 2 < 3 stopped
  REQUIRE(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS);
  CHECK(reserved(pool) == 0);
}

TEST_CASE("pool growth over capacity fails with CUDA_ERROR_OUT_OF_MEMORY and changes nothing") {
  startDriver(1, 8 * MiB);
  CUdeviceptr plain = 0;
  REQUIRE(cuMemAlloc(&plain, 5 * MiB) == CUDA_SUCCESS);
  CUmemoryPool pool = createPool();
  allocate(pool, 2 * MiB, nullptr);
  CHECK(stats().consumption == 7 * MiB);

  CUdeviceptr p = 0;
  CHECK(cuMemAllocFromPoolAsync(&p, 1000, pool, nullptr) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(stats().consumption == 7 * MiB);
  CHECK(reserved(pool) == 2 * MiB);
  CHECK(used(pool) == 2 * MiB);
  CHECK(attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 2 * MiB);
}

TEST_CASE("cuMemAllocAsync uses the device's current pool, initially the default pool") {
  startDriver();
  CUmemoryPool default_pool = nullptr;
  REQUIRE(cuDeviceGetDefaultMemPool(&default_pool, 0) == CUDA_SUCCESS);
  CUmemoryPool current = nullptr;
  REQUIRE(cuDeviceGetMemPool(&current, 0) == CUDA_SUCCESS);
  CHECK(current == default_pool);
  CHECK(attribute(default_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0);

  CUdeviceptr p = 0;
  REQUIRE(cuMemAllocAsync(&p, 1000, nullptr) == CUDA_SUCCESS);
  CHECK(used(default_pool) == 1024);
  CHECK(stats().pool_count == 0);  // the default pool is not counted

  CUmemoryPool pool = createPool();
  REQUIRE(cuDeviceSetMemPool(0, pool) == CUDA_SUCCESS);
  CUdeviceptr q = 0;
  REQUIRE(cuMemAllocAsync(&q, 1000, nullptr) == CUDA_SUCCESS);
  CHECK(used(pool) == 1024);
  CUmemoryPool owner = nullptr;
  REQUIRE(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, q) == CUDA_SUCCESS);
  CHECK(owner == pool);

  CHECK(cuMemAllocAsync(&q, 0, nullptr) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("a destroyed pool with outstanding allocations is released when the last one is freed") {
  startDriver();
  CUmemoryPool pool = createPool();
  REQUIRE(cuDeviceSetMemPool(0, pool) == CUDA_SUCCESS);
  CUdeviceptr a = allocate(pool, 1000, nullptr);
  CUdeviceptr b = allocate(pool, 1000, nullptr);
  REQUIRE(cuMemPoolDestroy(pool) == CUDA_SUCCESS);
  CHECK(stats().pool_count == 0);
  CHECK(stats().consumption == 2 * MiB);

  CUmemoryPool current = nullptr;
  REQUIRE(cuDeviceGetMemPool(&current, 0) == CUDA_SUCCESS);
  CUmemoryPool default_pool = nullptr;
  REQUIRE(cuDeviceGetDefaultMemPool(&default_pool, 0) == CUDA_SUCCESS);
  CHECK(current == default_pool);

  CUdeviceptr p = 0;
  CHECK(cuMemAllocFromPoolAsync(&p, 1000, pool, nullptr) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
  CHECK(stats().consumption == 2 * MiB);
  REQUIRE(cuMemFreeAsync(b, nullptr) == CUDA_SUCCESS);
  CHECK(stats().consumption == 0);
  CHECK(cuMemPoolDestroy(pool) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemPoolDestroy(default_pool) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("pool attributes: high-water marks reset to current, current values are read-only") {
  startDriver();
  CUmemoryPool pool = createPool();
  allocate(pool, 1000, nullptr);
  CUdeviceptr a = allocate(pool, 3 * MiB, nullptr);
  REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
  CHECK(attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 3 * MiB + 1024);

  cuuint64_t zero = 0;
  REQUIRE(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero) == CUDA_SUCCESS);
  CHECK(attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 1024);
  REQUIRE(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS);
  CHECK(attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 6 * MiB);
  REQUIRE(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero) == CUDA_SUCCESS);
  CHECK(attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 2 * MiB);

  cuuint64_t one = 1;
  CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &one) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &zero) ==
        CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("pool reuse policies default to 1 and are stored") {
  startDriver();
  CUmemoryPool pool = createPool();
  for (CUmemPool_attribute which :
       {CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
        CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES}) {
    int value = -1;
    REQUIRE(cuMemPoolGetAttribute(pool, which, &value) == CUDA_SUCCESS);
    CHECK(value == 1);
    int off = 0;
    REQUIRE(cuMemPoolSetAttribute(pool, which, &off) == CUDA_SUCCESS);
    REQUIRE(cuMemPoolGetAttribute(pool, which, &value) == CUDA_SUCCESS);
    CHECK(value == 0);
  }
}

TEST_CASE("pool access is read-write for the owning device and stored for peers") {
  startDriver(2);
  CUmemoryPool pool = createPool(0);
  CUmemLocation own{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemLocation peer{CU_MEM_LOCATION_TYPE_DEVICE, 1};
  CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  REQUIRE(cuMemPoolGetAccess(&flags, pool, &own) == CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  REQUIRE(cuMemPoolGetAccess(&flags, pool, &peer) == CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CUmemAccessDesc desc{peer, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  REQUIRE(cuMemPoolSetAccess(pool, &desc, 1) == CUDA_SUCCESS);
  REQUIRE(cuMemPoolGetAccess(&flags, pool, &peer) == CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
}

TEST_CASE("a stream of one device cannot be used with a pool of another") {
  startDriver(2);
  CUstream stream0 = createStream();
  CUmemoryPool pool1 = createPool(1);
  CUdeviceptr p = 0;
  CHECK(cuMemAllocFromPoolAsync(&p, 1000, pool1, stream0) == CUDA_ERROR_INVALID_VALUE);

  CUcontext ctx1 = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx1, 1) == CUDA_SUCCESS);
  REQUIRE(cuCtxPushCurrent(ctx1) == CUDA_SUCCESS);
  REQUIRE(cuMemAllocFromPoolAsync(&p, 1000, pool1, nullptr) == CUDA_SUCCESS);
  CHECK(stats(1).consumption == 2 * MiB);
  CHECK(stats(0).consumption == 0);
  CHECK(cuMemFreeAsync(p, stream0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFreeAsync(p, nullptr) == CUDA_SUCCESS);
}

TEST_CASE("cuMemFreeAsync accepts live allocations (pool or plain) and live streams only") {
  startDriver();
  CUmemoryPool pool = createPool();
  CUstream s = createStream();
  CUdeviceptr plain = 0;
  REQUIRE(cuMemAlloc(&plain, 1000) == CUDA_SUCCESS);
  CHECK(cuMemFreeAsync(plain, s) == CUDA_SUCCESS);  // as on an H200 with CUDA 13.0
  CHECK(stats().plain_count == 0);
  CHECK(cuMemFreeAsync(plain, s) == CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr p = allocate(pool, 1000, s);
  CHECK(cuMemFreeAsync(p + 512, s) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
  CHECK(cuMemFreeAsync(p, s) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuMemFreeAsync(p, nullptr) == CUDA_SUCCESS);
  CHECK(cuMemFreeAsync(p, nullptr) == CUDA_ERROR_INVALID_VALUE);
}

// ================================ contexts =====================================================

TEST_CASE("primary context reset frees everything of that device and leaves the context usable") {
  CUcontext ctx0 = startDriver(2);
  CUdeviceptr plain = 0;
  REQUIRE(cuMemAlloc(&plain, 1000) == CUDA_SUCCESS);
  CUmemoryPool pool = createPool(0);
  CUstream s = createStream();
  CUdeviceptr pooled = allocate(pool, 1000, s);
  REQUIRE(cuMemFreeAsync(pooled, s) == CUDA_SUCCESS);
  CUdeviceptr from_default = 0;
  REQUIRE(cuMemAllocAsync(&from_default, 1000, s) == CUDA_SUCCESS);
  REQUIRE(cuDeviceSetMemPool(0, pool) == CUDA_SUCCESS);
  CUmemoryPool pool1 = createPool(1);

  REQUIRE(cuDevicePrimaryCtxReset(0) == CUDA_SUCCESS);
  auto s0 = stats(0);
  CHECK(s0.consumption == 0);
  CHECK(s0.plain_count == 0);
  CHECK(s0.pool_count == 0);
  CHECK(s0.pending_free_count == 0);
  CHECK(stats(1).pool_count == 1);
  CHECK(cuStreamSynchronize(s) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuMemFree(plain) == CUDA_ERROR_INVALID_VALUE);
  CUmemoryPool current = nullptr;
  CUmemoryPool default_pool = nullptr;
  REQUIRE(cuDeviceGetMemPool(&current, 0) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetDefaultMemPool(&default_pool, 0) == CUDA_SUCCESS);
  CHECK(current == default_pool);
  CHECK(reserved(default_pool) == 0);
  CHECK(reserved(pool1) == 0);

  CUcontext still_current = nullptr;
  REQUIRE(cuCtxGetCurrent(&still_current) == CUDA_SUCCESS);
  CHECK(still_current == ctx0);
  REQUIRE(cuMemAlloc(&plain, 1000) == CUDA_SUCCESS);
  CHECK(stats(0).consumption == 1024);
}

TEST_CASE("the last release of a primary context destroys what it holds") {
  startDriver();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS);
  CHECK(stats().consumption == 0);
  CHECK(cuMemAlloc(&p, 1000) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cuDevicePrimaryCtxRelease(0) == CUDA_ERROR_INVALID_CONTEXT);
}

// ================================ streams and events ===========================================

TEST_CASE(
    "streams belong to the current context's device and special handles mean its default stream") {
  startDriver(2);
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUdevice device = -1;
  REQUIRE(cuStreamGetDevice(s, &device) == CUDA_SUCCESS);
  CHECK(device == 0);
  unsigned flags = 0;
  REQUIRE(cuStreamGetFlags(s, &flags) == CUDA_SUCCESS);
  CHECK(flags == CU_STREAM_NON_BLOCKING);
  CUcontext ctx = nullptr;
  REQUIRE(cuStreamGetCtx(s, &ctx) == CUDA_SUCCESS);
  CUcontext current = nullptr;
  REQUIRE(cuCtxGetCurrent(&current) == CUDA_SUCCESS);
  CHECK(ctx == current);
  for (CUstream special :
       {static_cast<CUstream>(nullptr), CU_STREAM_LEGACY, CU_STREAM_PER_THREAD}) {
    CHECK(cuStreamQuery(special) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(special) == CUDA_SUCCESS);
  }
  CHECK(cuStreamQuery(s) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
  CHECK(cuStreamQuery(s) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuStreamDestroy(s) == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("events complete at once") {
  startDriver();
  CUstream s = createStream();
  CUevent e = nullptr;
  REQUIRE(cuEventCreate(&e, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  CHECK(cuEventRecord(e, s) == CUDA_SUCCESS);
  CHECK(cuStreamWaitEvent(nullptr, e, 0) == CUDA_SUCCESS);
  CHECK(cuEventQuery(e) == CUDA_SUCCESS);
  CHECK(cuEventSynchronize(e) == CUDA_SUCCESS);
  REQUIRE(cuEventDestroy(e) == CUDA_SUCCESS);
  CHECK(cuEventQuery(e) == CUDA_ERROR_INVALID_HANDLE);
}

// ================================ stream capture ===============================================

TEST_CASE("capture: an unsafe call during a global capture fails and invalidates the capture") {
  startDriver();
  CUstream s = createStream();
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 1000) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(stats().plain_count == 0);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  REQUIRE(cuStreamIsCapturing(s, &status) == CUDA_SUCCESS);
  CHECK(status == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph graph = reinterpret_cast<CUgraph>(1);
  CHECK(cuStreamEndCapture(s, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(graph == nullptr);
  REQUIRE(cuStreamIsCapturing(s, &status) == CUDA_SUCCESS);
  CHECK(status == CU_STREAM_CAPTURE_STATUS_NONE);
  CHECK(cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
}

TEST_CASE("capture: cuMemFree and cuCtxSynchronize are prohibited, cuMemFree(0) is not") {
  startDriver();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
  CUstream s = createStream();
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
  CHECK(cuMemFree(0) == CUDA_SUCCESS);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  REQUIRE(cuStreamIsCapturing(s, &status) == CUDA_SUCCESS);
  CHECK(status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CHECK(cuMemFree(p) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(cuCtxSynchronize() == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph = nullptr;
  CHECK(cuStreamEndCapture(s, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(cuMemFree(p) == CUDA_SUCCESS);
}

TEST_CASE("capture: synchronizing the capturing stream is prohibited") {
  startDriver();
  CUstream s = createStream();
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  CHECK(cuStreamSynchronize(s) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph = nullptr;
  CHECK(cuStreamEndCapture(s, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

TEST_CASE("capture: a thread in relaxed mode may make unsafe calls") {
  startDriver();
  CUstream s = createStream();
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  CHECK(mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
  CHECK(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  CHECK(mode == CU_STREAM_CAPTURE_MODE_RELAXED);
  CUgraph graph = nullptr;
  REQUIRE(cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
  CHECK(graph != nullptr);
  CHECK(cuGraphDestroy(graph) == CUDA_SUCCESS);
  CHECK(cuGraphDestroy(graph) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("capture: another thread's global capture prohibits, its thread-local capture does not") {
  startDriver();
  CUstream s = createStream();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
  auto onOtherThread = [](auto&& work) { std::thread(work).join(); };

  CUresult begun = CUDA_ERROR_UNKNOWN;
  onOtherThread([&] { begun = cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL); });
  REQUIRE(begun == CUDA_SUCCESS);
  CHECK(cuMemFree(p) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph = nullptr;
  // Only the thread that began a non-relaxed capture may end it.
  CHECK(cuStreamEndCapture(s, &graph) == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  CUresult ended = CUDA_ERROR_UNKNOWN;
  onOtherThread([&] { ended = cuStreamEndCapture(s, &graph); });
  CHECK(ended == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

  // A thread in thread-local mode ignores other threads' captures.
  onOtherThread([&] { begun = cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL); });
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  CHECK(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  onOtherThread([&] { ended = cuStreamEndCapture(s, &graph); });
  CHECK(ended == CUDA_SUCCESS);

  onOtherThread([&] { begun = cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL); });
  CHECK(cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
  onOtherThread([&] { ended = cuStreamEndCapture(s, &graph); });
  CHECK(ended == CUDA_SUCCESS);
}

TEST_CASE("capture: legacy streams cannot capture, a stream captures once, and end needs a begin") {
  startDriver();
  CHECK(cuStreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(cuStreamBeginCapture(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUstream s = createStream();
  CUgraph graph = nullptr;
  CHECK(cuStreamEndCapture(s, &graph) == CUDA_ERROR_ILLEGAL_STATE);
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
}

TEST_CASE("capture: async allocations and frees on a capturing stream behave as usual") {
  startDriver();
  CUmemoryPool pool = createPool();
  CUstream s = createStream();
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUdeviceptr p = allocate(pool, 1000, s);
  CHECK(used(pool) == 1024);
  CHECK(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  CHECK(stats().pending_free_count == 1);
  CUgraph graph = nullptr;
  CHECK(cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
}

TEST_CASE("capture: cuStreamGetCaptureInfo reports the status and a distinct id per capture") {
  startDriver();
  CUstream s = createStream();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  REQUIRE(cuStreamGetCaptureInfo(s, &status, nullptr, nullptr, nullptr, nullptr, nullptr) ==
          CUDA_SUCCESS);
  CHECK(status == CU_STREAM_CAPTURE_STATUS_NONE);

  cuuint64_t ids[2] = {0, 0};
  for (cuuint64_t& id : ids) {
    REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    size_t dependencies = 99;
    REQUIRE(cuStreamGetCaptureInfo(s, &status, &id, nullptr, nullptr, nullptr, &dependencies) ==
            CUDA_SUCCESS);
    CHECK(status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHECK(dependencies == 0);
    CUgraph graph = nullptr;
    REQUIRE(cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
  }
  CHECK(ids[0] != 0);
  CHECK(ids[0] != ids[1]);
}

// ================================ copies, sets, pointers =======================================

TEST_CASE("copies and sets reach device memory inside live allocations and pool chunks") {
  startDriver();
  CUdeviceptr plain = 0;
  REQUIRE(cuMemAlloc(&plain, 1000) == CUDA_SUCCESS);
  std::vector<unsigned char> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i);
  REQUIRE(cuMemcpyHtoD(plain, data.data(), data.size()) == CUDA_SUCCESS);

  CUmemoryPool pool = createPool();
  CUdeviceptr pooled = allocate(pool, 1000, nullptr);
  REQUIRE(cuMemcpyDtoD(pooled, plain, 1000) == CUDA_SUCCESS);
  std::vector<unsigned char> back(1000, 0);
  REQUIRE(cuMemcpyDtoH(back.data(), pooled, back.size()) == CUDA_SUCCESS);
  CHECK(back == data);

  REQUIRE(cuMemsetD32(pooled, 0x01020304u, 4) == CUDA_SUCCESS);
  unsigned int words[4] = {};
  REQUIRE(cuMemcpy(reinterpret_cast<CUdeviceptr>(words), pooled, sizeof words) == CUDA_SUCCESS);
  CHECK(words[3] == 0x01020304u);
  REQUIRE(cuMemsetD8Async(plain, 0xab, 10, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoHAsync(back.data(), plain, 10, nullptr) == CUDA_SUCCESS);
  CHECK(back[9] == 0xab);
  // Anywhere in a reserved chunk is device memory, allocated or not.
  CHECK(cuMemsetD8(pooled + 1 * MiB, 0, 4096) == CUDA_SUCCESS);
}

TEST_CASE("a device range outside live memory is rejected and nothing is touched") {
  startDriver();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD8(p, 0x11, 1024) == CUDA_SUCCESS);
  std::vector<unsigned char> data(1024, 0x22);
  CHECK(cuMemcpyHtoD(p + 512, data.data(), 1024) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemsetD8(p + 1, 0x33, 1024) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemsetD32(p + 2, 0, 1) == CUDA_ERROR_INVALID_VALUE);
  std::vector<unsigned char> back(1024, 0);
  REQUIRE(cuMemcpyDtoH(back.data(), p, back.size()) == CUDA_SUCCESS);
  CHECK(back == std::vector<unsigned char>(1024, 0x11));

  std::vector<unsigned char> host(16);
  CHECK(cuMemcpyDtoH(back.data(), reinterpret_cast<CUdeviceptr>(host.data()), 16) ==
        CUDA_ERROR_INVALID_VALUE);
  // Unified addressing: cuMemcpy takes host memory at either end.
  CHECK(cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()),
                 reinterpret_cast<CUdeviceptr>(host.data()), 16) == CUDA_SUCCESS);
}

TEST_CASE("pointer attributes describe plain, pool and host allocations") {
  startDriver();
  CUdeviceptr plain = 0;
  REQUIRE(cuMemAlloc(&plain, 1000) == CUDA_SUCCESS);
  CUdeviceptr start = 0;
  size_t size = 0;
  REQUIRE(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, plain + 100) ==
          CUDA_SUCCESS);
  REQUIRE(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, plain + 100) ==
          CUDA_SUCCESS);
  CHECK(start == plain);
  CHECK(size == 1000);
  int ordinal = -1;
  REQUIRE(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, plain) ==
          CUDA_SUCCESS);
  CHECK(ordinal == 0);
  unsigned int type = 0;
  REQUIRE(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, plain) == CUDA_SUCCESS);
  CHECK(type == CU_MEMORYTYPE_DEVICE);
  CUmemoryPool owner = reinterpret_cast<CUmemoryPool>(1);
  REQUIRE(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, plain) ==
          CUDA_SUCCESS);
  CHECK(owner == nullptr);

  CUmemoryPool pool = createPool();
  CUdeviceptr pooled = allocate(pool, 3000, nullptr);
  REQUIRE(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, pooled) ==
          CUDA_SUCCESS);
  CHECK(owner == pool);
  REQUIRE(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, pooled) == CUDA_SUCCESS);
  CHECK(size == 3000);

  int on_stack = 0;
  CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                              reinterpret_cast<CUdeviceptr>(&on_stack)) ==
        CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemFree(plain) == CUDA_SUCCESS);
  CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, plain) ==
        CUDA_ERROR_INVALID_VALUE);
}

// ================================ cuGetProcAddress =============================================

TEST_CASE("cuGetProcAddress picks the variant that matches the caller's CUDA version") {
  cudadouble_reset(1, 64 * MiB);
  Resolved old = resolve("cuMemAlloc", 3000);
  CHECK(old.result == CUDA_ERROR_NOT_FOUND);  // the 32-bit cuMemAlloc is not simulated
  CHECK(old.status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK(old.function == nullptr);

  Resolved current = resolve("cuMemAlloc", 3020);
  CHECK(current.result == CUDA_SUCCESS);
  CHECK(current.status == CU_GET_PROC_ADDRESS_SUCCESS);
  CHECK(current.function == driverSymbol("cuMemAlloc_v2"));

  CHECK(resolve("cuMemFree", 12000).function == driverSymbol("cuMemFree_v2"));
  CHECK(resolve("cuMemGetInfo", 12000).function == driverSymbol("cuMemGetInfo_v2"));
  CHECK(resolve("cuCtxSynchronize", 12090).function == driverSymbol("cuCtxSynchronize"));
  CHECK(resolve("cuCtxSynchronize", 13000).function == driverSymbol("cuCtxSynchronize_v2"));
  CHECK(resolve("cuDevicePrimaryCtxRelease", 7000).function ==
        driverSymbol("cuDevicePrimaryCtxRelease"));
  CHECK(resolve("cuDevicePrimaryCtxRelease", 11000).function ==
        driverSymbol("cuDevicePrimaryCtxRelease_v2"));
  CHECK(driverSymbol("cuDevicePrimaryCtxRelease") != driverSymbol("cuDevicePrimaryCtxRelease_v2"));
  CHECK(resolve("cuStreamBeginCapture", 10010).function == driverSymbol("cuStreamBeginCapture_v2"));
  CHECK(resolve("cuStreamGetCaptureInfo", 12030).function ==
        driverSymbol("cuStreamGetCaptureInfo_v3"));
  CHECK(resolve("cuGetProcAddress", 11030).function == driverSymbol("cuGetProcAddress"));
  CHECK(resolve("cuGetProcAddress", 12000).function == driverSymbol("cuGetProcAddress_v2"));
  CHECK(resolve("cuMemAllocAsync", 11020).function == driverSymbol("cuMemAllocAsync"));
}

TEST_CASE(
    "cuGetProcAddress with the per-thread default stream flag picks the _ptsz and _ptds forms") {
  cudadouble_reset(1, 64 * MiB);
  const cuuint64_t per_thread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  CHECK(resolve("cuMemAllocAsync", 11020, per_thread).function ==
        driverSymbol("cuMemAllocAsync_ptsz"));
  CHECK(resolve("cuMemFreeAsync", 11020, per_thread).function ==
        driverSymbol("cuMemFreeAsync_ptsz"));
  CHECK(resolve("cuMemAllocFromPoolAsync", 11020, per_thread).function ==
        driverSymbol("cuMemAllocFromPoolAsync_ptsz"));
  CHECK(resolve("cuStreamBeginCapture", 10010, per_thread).function ==
        driverSymbol("cuStreamBeginCapture_v2_ptsz"));
  CHECK(resolve("cuMemcpyHtoD", 13000, per_thread).function ==
        driverSymbol("cuMemcpyHtoD_v2_ptds"));
  CHECK(resolve("cuStreamSynchronize", 13000, per_thread).function ==
        driverSymbol("cuStreamSynchronize_ptsz"));
  // No per-thread form: the plain variant.
  CHECK(resolve("cuMemAlloc", 13000, per_thread).function == driverSymbol("cuMemAlloc_v2"));
  // Per-thread forms exist from CUDA 7.0 on.
  CHECK(resolve("cuStreamSynchronize", 6050, per_thread).function ==
        driverSymbol("cuStreamSynchronize"));
  CHECK(resolve("cuStreamSynchronize", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM).function ==
        driverSymbol("cuStreamSynchronize"));
}

TEST_CASE("cuGetProcAddress takes base names only") {
  cudadouble_reset(1, 64 * MiB);
  for (const char* name :
       {"cuNoSuchFunction", "cuMemAlloc_v2", "cuMemAllocAsync_ptsz", "cudadouble_reset"}) {
    Resolved r = resolve(name, 13000);
    CHECK(r.result == CUDA_ERROR_NOT_FOUND);
    CHECK(r.status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    CHECK(r.function == nullptr);
  }
  void* pfn = nullptr;
  CHECK(cuGetProcAddress(nullptr, &pfn, 13000, 0, nullptr) == CUDA_ERROR_INVALID_VALUE);
  const void* table = nullptr;
  CUuuid id{};
  CHECK(cuGetExportTable(&table, &id) == CUDA_ERROR_NOT_SUPPORTED);
}

// ================================ threads ======================================================

TEST_CASE("concurrent allocations from several threads keep the accounting exact") {
  CUcontext ctx = startDriver(1, 256 * MiB);
  CUmemoryPool pool = createPool();
  constexpr int kThreads = 4;
  constexpr int kRounds = 500;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ++failures;
      CUstream stream = nullptr;
      if (cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) ++failures;
      for (int i = 0; i < kRounds; ++i) {
        CUdeviceptr pooled = 0;
        CUdeviceptr plain = 0;
        const size_t size = 512 * static_cast<size_t>(1 + (i + t) % 7);
        if (cuMemAllocFromPoolAsync(&pooled, size, pool, stream) != CUDA_SUCCESS) ++failures;
        if (cuMemAlloc(&plain, size) != CUDA_SUCCESS) ++failures;
        if (cuMemsetD8Async(pooled, static_cast<unsigned char>(t), size, stream) != CUDA_SUCCESS)
          ++failures;
        if (cuMemFreeAsync(pooled, stream) != CUDA_SUCCESS) ++failures;
        if (cuMemFree(plain) != CUDA_SUCCESS) ++failures;
        if (i % 50 == 0 && cuStreamSynchronize(stream) != CUDA_SUCCESS) ++failures;
      }
      if (cuStreamDestroy(stream) != CUDA_SUCCESS) ++failures;
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(failures == 0);
  CHECK(used(pool) == 0);
  CHECK(stats().plain_count == 0);
  CHECK(stats().pending_free_count == 0);
  REQUIRE(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS);
  CHECK(stats().consumption == 0);
  CHECK(cudadouble_call_count("cuMemAlloc_v2") == kThreads * kRounds);
}

// ================================ control API ==================================================

TEST_CASE("call counts count each entry point by its exported name since the last reset") {
  startDriver();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  CHECK(cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);
  CUmemoryPool pool = createPool();
  allocate(pool, 1000, nullptr);
  REQUIRE(cuMemAllocFromPoolAsync_ptsz(&p, 1000, pool, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(nullptr) == CUDA_SUCCESS);

  CHECK(cudadouble_call_count("cuInit") == 1);
  CHECK(cudadouble_call_count("cuMemAlloc_v2") == 1);
  CHECK(cudadouble_call_count("cuMemFree_v2") == 2);
  CHECK(cudadouble_call_count("cuMemAllocFromPoolAsync") == 1);
  CHECK(cudadouble_call_count("cuMemAllocFromPoolAsync_ptsz") == 1);
  CHECK(cudadouble_call_count("cuStreamSynchronize") == 1);
  CHECK(cudadouble_call_count("cuMemAlloc") == 0);
  CHECK(cudadouble_call_count("no such entry point") == 0);

  cudadouble_reset(1, 64 * MiB);
  CHECK(cudadouble_call_count("cuMemFree_v2") == 0);
}

TEST_CASE("cudadouble_reset forgets everything and requires cuInit again") {
  startDriver(1, 64 * MiB);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
  createPool();
  CUstream s = createStream();

  cudadouble_reset(3, 16 * MiB);
  CHECK(cuMemFree(p) == CUDA_ERROR_NOT_INITIALIZED);
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext current = reinterpret_cast<CUcontext>(1);
  REQUIRE(cuCtxGetCurrent(&current) == CUDA_SUCCESS);
  CHECK(current == nullptr);
  auto s0 = stats(0);
  CHECK(s0.consumption == 0);
  CHECK(s0.capacity == 16 * MiB);
  CHECK(s0.pool_count == 0);
  cudadouble_device_stats_t unused{};
  CHECK(cudadouble_device_stats(2, &unused) == 0);
  CHECK(cudadouble_device_stats(3, &unused) == -1);
  CHECK(cuStreamQuery(s) == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("cuGetErrorName and cuGetErrorString know every code the double returns") {
  for (CUresult code :
       {CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_CONTEXT,
        CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_NOT_FOUND,
        CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD}) {
    const char* name = nullptr;
    const char* text = nullptr;
    CHECK(cuGetErrorName(code, &name) == CUDA_SUCCESS);
    CHECK(cuGetErrorString(code, &text) == CUDA_SUCCESS);
    CHECK(name != nullptr);
    CHECK(text != nullptr);
  }
  const char* name = nullptr;
  CHECK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &name) == CUDA_SUCCESS);
  CHECK(std::string(name) == "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK(cuGetErrorName(static_cast<CUresult>(123456), &name) == CUDA_ERROR_INVALID_VALUE);
  CHECK(name == nullptr);
}

// ================================ runtime double ===============================================

TEST_CASE("runtime: cudaMalloc(0) returns nullptr without calling the driver") {
  startRuntime();
  void* p = reinterpret_cast<void*>(1);
  CHECK(cudaMalloc(&p, 0) == cudaSuccess);
  CHECK(p == nullptr);
  CHECK(cudadouble_call_count("cuMemAlloc_v2") == 0);
  CHECK(cudaMalloc(nullptr, 16) == cudaErrorInvalidValue);
}

TEST_CASE(
    "runtime: cudaMalloc and cudaFree reach cuMemAlloc_v2, cuCtxSynchronize and cuMemFree_v2") {
  startRuntime();
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 1000) == cudaSuccess);
  CHECK(stats().plain_bytes == 1024);
  REQUIRE(cudaFree(p) == cudaSuccess);
  CHECK(cudadouble_call_count("cuMemAlloc_v2") == 1);
  CHECK(cudadouble_call_count("cuCtxSynchronize") == 1);
  CHECK(cudadouble_call_count("cuMemFree_v2") == 1);
  CHECK(cudaFree(nullptr) == cudaSuccess);
  CHECK(cudadouble_call_count("cuMemFree_v2") == 1);
  CHECK(cudaFree(p) == cudaErrorInvalidValue);
}

TEST_CASE("runtime: an error stays until cudaGetLastError, successful calls do not clear it") {
  startRuntime(1, 4 * MiB);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 8 * MiB) == cudaErrorMemoryAllocation);
  REQUIRE(cudaMalloc(&p, 1000) == cudaSuccess);
  CHECK(cudaPeekAtLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(std::string(cudaGetErrorName(cudaErrorMemoryAllocation)) == "cudaErrorMemoryAllocation");
  CHECK(std::string(cudaGetErrorString(cudaErrorMemoryAllocation)) == "out of memory");
}

TEST_CASE("runtime: cudaSetDevice makes that device's primary context current") {
  startRuntime(2);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  CUdevice device = -1;
  REQUIRE(cuCtxGetDevice(&device) == CUDA_SUCCESS);
  CHECK(device == 1);
  int current = -1;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  CHECK(current == 1);
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 1000) == cudaSuccess);
  CHECK(stats(1).plain_count == 1);
  CHECK(stats(0).plain_count == 0);
  CHECK(cudaSetDevice(2) == cudaErrorInvalidDevice);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

TEST_CASE("runtime: a driver reset underneath is recovered from") {
  startRuntime();
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 1000) == cudaSuccess);
  cudadouble_reset(1, 32 * MiB);
  size_t free = 0;
  size_t total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  CHECK(total == 32 * MiB);
  REQUIRE(cudaMalloc(&p, 1000) == cudaSuccess);
  CHECK(stats().plain_count == 1);
}

TEST_CASE("runtime: async allocations use the plain or the per-thread driver entry points") {
  startRuntime();
  void* p = nullptr;
  REQUIRE(cudaMallocAsync(&p, 1000, nullptr) == cudaSuccess);
  REQUIRE(cudaFreeAsync(p, nullptr) == cudaSuccess);
  REQUIRE(cudaMallocAsync_ptsz(&p, 1000, nullptr) == cudaSuccess);
  REQUIRE(cudaFreeAsync_ptsz(p, nullptr) == cudaSuccess);
  CHECK(cudadouble_call_count("cuMemAllocAsync") == 1);
  CHECK(cudadouble_call_count("cuMemAllocAsync_ptsz") == 1);
  CHECK(cudadouble_call_count("cuMemFreeAsync") == 1);
  CHECK(cudadouble_call_count("cuMemFreeAsync_ptsz") == 1);
  // Size 0 and a null free succeed without memory, as the real runtime does (H200, CUDA 13.0).
  p = &p;
  CHECK(cudaMallocAsync(&p, 0, nullptr) == cudaSuccess);
  CHECK(p == nullptr);
  CHECK(cudaFreeAsync(nullptr, nullptr) == cudaSuccess);
  CHECK(cudadouble_call_count("cuMemFreeAsync") == 1);
  REQUIRE(cudaStreamSynchronize_ptsz(nullptr) == cudaSuccess);
  CHECK(cudadouble_call_count("cuStreamSynchronize_ptsz") == 1);
  CHECK(stats().consumption == 0);
}

TEST_CASE("runtime: memory pools") {
  startRuntime();
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool = nullptr;
  REQUIRE(cudaMemPoolCreate(&pool, &props) == cudaSuccess);
  cuuint64_t threshold = 4 * MiB;
  REQUIRE(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold) ==
          cudaSuccess);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  void* p = nullptr;
  REQUIRE(cudaMallocFromPoolAsync(&p, 1000, pool, stream) == cudaSuccess);
  REQUIRE(cudaFreeAsync(p, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  cuuint64_t value = 0;
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &value) == cudaSuccess);
  CHECK(value == 2 * MiB);
  REQUIRE(cudaMemPoolTrimTo(pool, 0) == cudaSuccess);
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &value) == cudaSuccess);
  CHECK(value == 0);
  REQUIRE(cudaDeviceSetMemPool(0, pool) == cudaSuccess);
  cudaMemPool_t current = nullptr;
  REQUIRE(cudaDeviceGetMemPool(&current, 0) == cudaSuccess);
  CHECK(current == pool);
  REQUIRE(cudaMemPoolDestroy(pool) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("runtime: cudaMalloc during a global capture fails and invalidates the capture") {
  startRuntime();
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 1000) == cudaErrorStreamCaptureUnsupported);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  REQUIRE(cudaStreamIsCapturing(stream, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusInvalidated);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaErrorStreamCaptureInvalidated);
  CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);

  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
  CHECK(cudaMalloc(&p, 1000) == cudaSuccess);
  REQUIRE(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
}

TEST_CASE("runtime: copies, sets and pointer attributes") {
  startRuntime();
  void* device = nullptr;
  REQUIRE(cudaMalloc(&device, 256) == cudaSuccess);
  std::vector<int> values(64, 7);
  REQUIRE(cudaMemset(device, 0, 256) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(device, values.data(), 128, cudaMemcpyHostToDevice, nullptr) ==
          cudaSuccess);
  std::vector<int> back(64, -1);
  REQUIRE(cudaMemcpy(back.data(), device, 256, cudaMemcpyDefault) == cudaSuccess);
  CHECK(back[31] == 7);
  CHECK(back[32] == 0);
  CHECK(cudaMemcpy(back.data(), device, 256, static_cast<cudaMemcpyKind>(9)) ==
        cudaErrorInvalidMemcpyDirection);

  cudaPointerAttributes attributes{};
  REQUIRE(cudaPointerGetAttributes(&attributes, device) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeDevice);
  CHECK(attributes.device == 0);
  CHECK(attributes.devicePointer == device);
  CHECK(attributes.hostPointer == nullptr);
  REQUIRE(cudaPointerGetAttributes(&attributes, values.data()) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeUnregistered);

  void* host = nullptr;
  REQUIRE(cudaMallocHost(&host, 64) == cudaSuccess);
  REQUIRE(cudaPointerGetAttributes(&attributes, host) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeHost);
  CHECK(attributes.hostPointer == host);
  CHECK(cudaFreeHost(host) == cudaSuccess);
}

TEST_CASE("runtime: cudaDeviceReset empties the current device") {
  startRuntime();
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 1000) == cudaSuccess);
  REQUIRE(cudaMallocAsync(&p, 1000, nullptr) == cudaSuccess);
  REQUIRE(cudaDeviceReset() == cudaSuccess);
  CHECK(stats().consumption == 0);
  REQUIRE(cudaMalloc(&p, 1000) == cudaSuccess);
  CHECK(stats().consumption == 1024);
}

TEST_CASE("runtime: versions and device attributes") {
  startRuntime(2, 64 * MiB);
  int version = 0;
  REQUIRE(cudaRuntimeGetVersion(&version) == cudaSuccess);
  CHECK(version == 13000);
  REQUIRE(cudaDriverGetVersion(&version) == cudaSuccess);
  CHECK(version == 13000);
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(count == 2);
  int value = 0;
  REQUIRE(cudaDeviceGetAttribute(&value, cudaDevAttrMemoryPoolsSupported, 1) == cudaSuccess);
  CHECK(value == 1);
  CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrClockRate, 0) == cudaErrorInvalidValue);
}

namespace {

// `bytes` of exportable (or not) physical memory on device 0, mapped read-write at a new range.
struct MappedVmm {
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr va = 0;
  size_t bytes = 0;
};

CUmemAllocationProp vmmProp(CUmemAllocationHandleType types) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = types;
  return prop;
}

CUdeviceptr mapReadWrite(CUmemGenericAllocationHandle handle, size_t bytes) {
  CUdeviceptr va = 0;
  REQUIRE(cuMemAddressReserve(&va, bytes, 0, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemMap(va, bytes, 0, handle, 0) == CUDA_SUCCESS);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  REQUIRE(cuMemSetAccess(va, bytes, &access, 1) == CUDA_SUCCESS);
  return va;
}

MappedVmm exportableVmm(size_t bytes) {
  MappedVmm m;
  m.bytes = bytes;
  const CUmemAllocationProp prop = vmmProp(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  REQUIRE(cuMemCreate(&m.handle, bytes, &prop, 0) == CUDA_SUCCESS);
  m.va = mapReadWrite(m.handle, bytes);
  return m;
}

}  // namespace

TEST_CASE(
    "VMM memory made with the POSIX descriptor handle type exports a descriptor that imports as "
    "the same memory, counted once") {
  startDriver();
  MappedVmm m = exportableVmm(2 * MiB);
  std::memset(reinterpret_cast<void*>(m.va), 0x5A, m.bytes);
  int fd = -1;
  REQUIRE(cuMemExportToShareableHandle(&fd, m.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                       0) == CUDA_SUCCESS);
  CHECK(fd >= 0);
  CHECK((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);  // a child made by exec does not inherit it
  CUmemGenericAllocationHandle imported = 0;
  REQUIRE(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(intptr_t{fd}),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS);
  close(fd);  // the import keeps its own
  CHECK(imported != m.handle);
  CHECK(stats().vmm_bytes == 2 * MiB);  // the same memory, not more of it
  const CUdeviceptr other = mapReadWrite(imported, m.bytes);
  CHECK(static_cast<unsigned char*>(reinterpret_cast<void*>(other))[m.bytes - 1] == 0x5A);
  static_cast<unsigned char*>(reinterpret_cast<void*>(other))[0] = 0x11;
  CHECK(static_cast<unsigned char*>(reinterpret_cast<void*>(m.va))[0] == 0x11);
  REQUIRE(cuMemUnmap(other, m.bytes) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(imported) == CUDA_SUCCESS);
  CHECK(stats().vmm_bytes == 2 * MiB);
  REQUIRE(cuMemUnmap(m.va, m.bytes) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(m.handle) == CUDA_SUCCESS);
  CHECK(stats().vmm_bytes == 0);
}

TEST_CASE("an exported VMM descriptor imported in a forked child shares the memory both ways") {
  startDriver();
  MappedVmm m = exportableVmm(4 * MiB);
  std::memset(reinterpret_cast<void*>(m.va), 0x33, m.bytes);
  int fd = -1;
  REQUIRE(cuMemExportToShareableHandle(&fd, m.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                       0) == CUDA_SUCCESS);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Exit status: 0 when the child saw the parent's bytes and wrote its own.
    CUmemGenericAllocationHandle h = 0;
    if (cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(intptr_t{fd}),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS)
      _exit(2);
    CUdeviceptr va = 0;
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (cuMemAddressReserve(&va, m.bytes, 0, 0, 0) != CUDA_SUCCESS ||
        cuMemMap(va, m.bytes, 0, h, 0) != CUDA_SUCCESS ||
        cuMemSetAccess(va, m.bytes, &access, 1) != CUDA_SUCCESS)
      _exit(3);
    auto* bytes = static_cast<unsigned char*>(reinterpret_cast<void*>(va));
    if (bytes[12345] != 0x33) _exit(4);
    bytes[m.bytes / 2] = 0xC4;
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(static_cast<unsigned char*>(reinterpret_cast<void*>(m.va))[m.bytes / 2] == 0xC4);
  close(fd);
  REQUIRE(cuMemUnmap(m.va, m.bytes) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(m.handle) == CUDA_SUCCESS);
}

TEST_CASE(
    "VMM export refuses memory not made exportable and other handle types, and import a "
    "descriptor the double did not make") {
  startDriver();
  CUmemGenericAllocationHandle plain = 0;
  const CUmemAllocationProp none = vmmProp(CU_MEM_HANDLE_TYPE_NONE);
  REQUIRE(cuMemCreate(&plain, 2 * MiB, &none, 0) == CUDA_SUCCESS);
  int fd = -1;
  CHECK(cuMemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(fd == -1);
  MappedVmm m = exportableVmm(2 * MiB);
  CHECK(cuMemExportToShareableHandle(&fd, m.handle, CU_MEM_HANDLE_TYPE_FABRIC, 0) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemExportToShareableHandle(&fd, m.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1) ==
        CUDA_ERROR_INVALID_VALUE);
  CUmemGenericAllocationHandle h = 0;
  const CUmemAllocationProp fabric = vmmProp(CU_MEM_HANDLE_TYPE_FABRIC);
  CHECK(cuMemCreate(&h, 2 * MiB, &fabric, 0) == CUDA_ERROR_NOT_SUPPORTED);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(null_fd >= 0);
  CHECK(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(intptr_t{null_fd}),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
        CUDA_ERROR_INVALID_HANDLE);
  close(null_fd);
  CHECK(stats().vmm_bytes == 4 * MiB);
  REQUIRE(cuMemRelease(plain) == CUDA_SUCCESS);
  REQUIRE(cuMemUnmap(m.va, m.bytes) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(m.handle) == CUDA_SUCCESS);
}
