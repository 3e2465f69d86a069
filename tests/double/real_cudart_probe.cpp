// A plain CUDA runtime program, linked against the real libcudart.so like any CUDA program.
// Run with LD_LIBRARY_PATH pointing at the doubles, it must load libcudart.so.13 from there and
// resolve its versioned references (cudaMalloc@libcudart.so.13, ...) against the double.
// CTest compares its output; checks that cannot be expressed as output print "FAILED".
//
// Expects CUDADOUBLE_DEVICES=2 and CUDADOUBLE_MEM=256M.

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <vector>

namespace {

void report(const char* what, cudaError_t e) {
  std::printf("%s: %s\n", what, cudaGetErrorName(e));
}

void expect(bool ok, const char* what) {
  if (!ok) std::printf("FAILED: %s\n", what);
}

size_t poolAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  unsigned long long value = 0;
  expect(cudaMemPoolGetAttribute(pool, attr, &value) == cudaSuccess, "cudaMemPoolGetAttribute");
  return static_cast<size_t>(value);
}

}  // namespace

int main() {
  Dl_info info{};
  dladdr(reinterpret_cast<void*>(&cudaMalloc), &info);
  std::printf("libcudart: %s\n", info.dli_fname ? info.dli_fname : "?");

  int runtime_version = 0;
  int driver_version = 0;
  int devices = 0;
  cudaRuntimeGetVersion(&runtime_version);
  cudaDriverGetVersion(&driver_version);
  cudaGetDeviceCount(&devices);
  std::printf("runtime version: %d\ndriver version: %d\ndevices: %d\n", runtime_version,
              driver_version, devices);

  size_t free = 0;
  size_t total = 0;
  expect(cudaMemGetInfo(&free, &total) == cudaSuccess, "cudaMemGetInfo");
  std::printf("memory: free %zu total %zu\n", free, total);

  void* device = nullptr;
  report("cudaMalloc(1000)", cudaMalloc(&device, 1000));
  cudaMemGetInfo(&free, &total);
  std::printf("memory after cudaMalloc: free %zu\n", free);

  std::vector<unsigned char> sent(1000);
  std::vector<unsigned char> received(1000, 0);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<unsigned char>(i * 7);
  expect(cudaMemcpy(device, sent.data(), sent.size(), cudaMemcpyHostToDevice) == cudaSuccess,
         "HtoD");
  expect(
      cudaMemcpy(received.data(), device, received.size(), cudaMemcpyDeviceToHost) == cudaSuccess,
      "DtoH");
  std::printf("round trip through device memory: %s\n", sent == received ? "equal" : "different");
  report("cudaFree", cudaFree(device));

  cudaStream_t stream = nullptr;
  expect(cudaStreamCreate(&stream) == cudaSuccess, "cudaStreamCreate");
  void* pooled = nullptr;
  report("cudaMallocAsync(1000)", cudaMallocAsync(&pooled, 1000, stream));
  cudaMemPool_t pool = nullptr;
  expect(cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess, "cudaDeviceGetDefaultMemPool");
  std::printf("default pool: used %zu reserved %zu\n",
              poolAttribute(pool, cudaMemPoolAttrUsedMemCurrent),
              poolAttribute(pool, cudaMemPoolAttrReservedMemCurrent));
  report("cudaFreeAsync", cudaFreeAsync(pooled, stream));
  report("cudaStreamSynchronize", cudaStreamSynchronize(stream));
  std::printf("default pool after synchronize: used %zu reserved %zu\n",
              poolAttribute(pool, cudaMemPoolAttrUsedMemCurrent),
              poolAttribute(pool, cudaMemPoolAttrReservedMemCurrent));
  expect(cudaStreamDestroy(stream) == cudaSuccess, "cudaStreamDestroy");

  report("cudaSetDevice(1)", cudaSetDevice(1));
  void* on_device_1 = nullptr;
  expect(cudaMalloc(&on_device_1, 4096) == cudaSuccess, "cudaMalloc on device 1");
  cudaPointerAttributes attributes{};
  expect(cudaPointerGetAttributes(&attributes, on_device_1) == cudaSuccess,
         "cudaPointerGetAttributes");
  std::printf("pointer on device 1: device %d type %d\n", attributes.device,
              static_cast<int>(attributes.type));

  void* too_big = nullptr;
  report("cudaMalloc(1 GiB)", cudaMalloc(&too_big, size_t{1} << 30));
  report("cudaGetLastError", cudaGetLastError());
  report("cudaGetLastError again", cudaGetLastError());

  // The runtime opened the driver double; the control API shows how it was reached.
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  using CallCount = unsigned long long (*)(const char*);
  auto calls =
      driver ? reinterpret_cast<CallCount>(dlsym(driver, "cudadouble_call_count")) : nullptr;
  expect(calls != nullptr, "the driver double is loaded");
  if (calls != nullptr) {
    std::printf("driver calls: cuGetProcAddress_v2 %s, cuMemAlloc_v2 %llu, cuMemAllocAsync %llu\n",
                calls("cuGetProcAddress_v2") > 0 ? "used" : "unused", calls("cuMemAlloc_v2"),
                calls("cuMemAllocAsync"));
  }
  std::printf("done\n");
  return 0;
}
