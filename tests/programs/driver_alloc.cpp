// Allocates through the driver API only (as JAX, numba and statically linked runtimes do):
// it loads libcuda.so.1 itself and never links the CUDA runtime.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>

int main() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW);
  if (h == nullptr) {
    std::printf("driver_alloc: cannot load libcuda.so.1\n");
    return 4;
  }
  auto init = reinterpret_cast<decltype(&cuInit)>(dlsym(h, "cuInit"));
  auto get = reinterpret_cast<decltype(&cuDeviceGet)>(dlsym(h, "cuDeviceGet"));
  auto retain =
      reinterpret_cast<decltype(&cuDevicePrimaryCtxRetain)>(dlsym(h, "cuDevicePrimaryCtxRetain"));
  auto set = reinterpret_cast<decltype(&cuCtxSetCurrent)>(dlsym(h, "cuCtxSetCurrent"));
  auto alloc = reinterpret_cast<decltype(&cuMemAlloc_v2)>(dlsym(h, "cuMemAlloc_v2"));
  auto release = reinterpret_cast<decltype(&cuMemFree_v2)>(dlsym(h, "cuMemFree_v2"));
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUdeviceptr p = 0;
  const CUresult r1 = init(0);
  const CUresult r2 = get(&dev, 0);
  const CUresult r3 = retain(&ctx, dev);
  const CUresult r4 = set(ctx);
  const CUresult r5 = alloc(&p, 1 << 20);
  const CUresult r6 = release(p);
  std::printf("driver_alloc: %d %d %d %d %d %d\n", r1, r2, r3, r4, r5, r6);
  return 0;
}
