// Allocates device memory through the driver's virtual-memory calls only, as JAX's platform
// allocator, PyTorch's expandable_segments and NCCL do: three 8 MiB handles mapped into one
// reserved range, one unmapped and released, one released while still mapped (its memory stays
// until the unmap), then everything unmapped. It loads libcuda.so.1 itself (dlsym, as such
// frameworks do). Prints each step's result and the device's free memory in MiB.
//   vmm_alloc [keep]   (keep: the third handle stays made and mapped at exit)
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <string_view>

namespace {

// clang-format off
#define DRIVER_FUNCTIONS(X) \
  X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuMemCreate) \
  X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemAddressReserve) X(cuMemAddressFree) \
  X(cuMemSetAccess) X(cuMemGetInfo_v2)
// clang-format on

struct Driver {
#define DRIVER_FIELD(name) decltype(&::name) name = nullptr;
  DRIVER_FUNCTIONS(DRIVER_FIELD)
#undef DRIVER_FIELD
};

constexpr size_t kMiB = size_t{1} << 20;
CUmemAllocationProp g_prop = {};

// The call site the log must name for the physical memory.
__attribute__((noinline)) CUresult make_physical(const Driver& d, CUmemGenericAllocationHandle* h,
                                                 size_t bytes) {
  const CUresult r = d.cuMemCreate(h, bytes, &g_prop, 0);
  asm volatile("" ::: "memory");  // no tail call: this frame must be on the stack
  return r;
}

size_t free_mib(const Driver& d) {
  size_t free = 0, total = 0;
  d.cuMemGetInfo_v2(&free, &total);
  return free / kMiB;
}

}  // namespace

int main(int argc, char** argv) {
  const bool keep = argc > 1 && std::string_view(argv[1]) == "keep";
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (lib == nullptr) {
    std::printf("vmm_alloc: cannot load libcuda.so.1\n");
    return 4;
  }
  Driver d;
#define DRIVER_LOAD(name) d.name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name));
  DRIVER_FUNCTIONS(DRIVER_LOAD)
#undef DRIVER_LOAD
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (d.cuInit(0) != CUDA_SUCCESS || d.cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      d.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
      d.cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    std::printf("vmm_alloc: no device\n");
    return 5;
  }
  g_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  g_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  g_prop.location.id = dev;
  const size_t piece = 8 * kMiB;
  CUdeviceptr va = 0;
  std::printf("reserve %d\n", d.cuMemAddressReserve(&va, 3 * piece, 0, 0, 0));
  const size_t before = free_mib(d);
  CUmemGenericAllocationHandle h[3] = {};
  for (int i = 0; i < 3; ++i) {
    const CUresult c = make_physical(d, &h[i], piece);
    const CUresult m = d.cuMemMap(va + i * piece, piece, 0, h[i], 0);
    std::printf("create %d map %d\n", c, m);
  }
  CUmemAccessDesc access = {};
  access.location = g_prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult a = d.cuMemSetAccess(va, 3 * piece, &access, 1);
  std::printf("access %d, in use %zu MiB\n", a, before - free_mib(d));
  // One call a statement: the order of a function's arguments is unspecified.
  const CUresult u0 = d.cuMemUnmap(va, piece);
  const CUresult r0 = d.cuMemRelease(h[0]);
  std::printf("unmap %d release %d, in use %zu MiB\n", u0, r0, before - free_mib(d));
  const CUresult r1 = d.cuMemRelease(h[1]);
  std::printf("release while mapped %d, in use %zu MiB\n", r1, before - free_mib(d));
  if (keep) {
    const CUresult u1 = d.cuMemUnmap(va + piece, piece);
    std::printf("unmap %d, in use %zu MiB, one handle kept\n", u1, before - free_mib(d));
    return 0;
  }
  const CUresult u12 = d.cuMemUnmap(va + piece, 2 * piece);
  std::printf("unmap %d, in use %zu MiB\n", u12, before - free_mib(d));
  const CUresult r2 = d.cuMemRelease(h[2]);
  const CUresult f = d.cuMemAddressFree(va, 3 * piece);
  std::printf("release %d free %d, in use %zu MiB\n", r2, f, before - free_mib(d));
  return 0;
}
