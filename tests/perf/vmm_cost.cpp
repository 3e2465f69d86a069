// Times the driver's virtual memory calls on one GPU: cuMemCreate, cuMemMap, cuMemSetAccess,
// cuMemUnmap and cuMemRelease of one mapping, in turn, medians of 40 rounds for each of several
// sizes, plain and exportable (POSIX descriptor handle type, POOLSHIM_IPC=1, issue 14) in
// interleaved turns, with the device memory 50 pages of 20 MiB of each kind take; and ten
// 2 MiB mappings under one set-access. What the heap's paged arenas pay per
// mapping (DESIGN §7; docs/measurements/2026-12-04-h200-vmm-call-costs.txt). Not built by CMake
// (it needs a GPU); on the GPU machine:
//
//     nvcc -O2 -o /tmp/vmm_cost tests/perf/vmm_cost.cpp -lcuda && /tmp/vmm_cost
#include <cuda.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
#define CK(x)                                \
  do {                                       \
    CUresult r_ = (x);                       \
    if (r_ != CUDA_SUCCESS) {                \
      std::printf("%s failed %d\n", #x, r_); \
      return 1;                              \
    }                                        \
  } while (0)
static double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
int main() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemAccessDesc acc{};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t gran = 0;
  CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  std::printf("granularity %zu\n", gran);
  CUdeviceptr va;
  const size_t span = 1ULL << 34;
  CK(cuMemAddressReserve(&va, span, 0, 0, 0));
  CUmemAllocationProp exportable = prop;
  exportable.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  const CUmemAllocationProp* kinds[2] = {&prop, &exportable};
  const char* names[2] = {"plain", "exportable"};
  for (size_t mib : {2, 4, 8, 20, 40}) {
    const size_t bytes = mib << 20;
    const int n = 40;
    std::vector<double> c[2], m[2], a[2], u[2], r[2];
    for (int i = 0; i < n; ++i) {
      for (int turn = 0; turn < 2; ++turn) {
        const int k = (i + turn) % 2;  // which kind goes first alternates
        CUmemGenericAllocationHandle h;
        CUdeviceptr at = va + (size_t)i * (64ULL << 20);
        double t0 = now_us();
        CK(cuMemCreate(&h, bytes, kinds[k], 0));
        double t1 = now_us();
        CK(cuMemMap(at, bytes, 0, h, 0));
        double t2 = now_us();
        CK(cuMemSetAccess(at, bytes, &acc, 1));
        double t3 = now_us();
        CK(cuMemUnmap(at, bytes));
        double t4 = now_us();
        CK(cuMemRelease(h));
        double t5 = now_us();
        c[k].push_back(t1 - t0);
        m[k].push_back(t2 - t1);
        a[k].push_back(t3 - t2);
        u[k].push_back(t4 - t3);
        r[k].push_back(t5 - t4);
      }
    }
    auto med = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    for (int k = 0; k < 2; ++k) {
      std::printf(
          "mapping %3zu MiB %-10s: create %.1f us, map %.1f, set_access %.1f, unmap %.1f, "
          "release %.1f; total %.1f us\n",
          mib, names[k], med(c[k]), med(m[k]), med(a[k]), med(u[k]), med(r[k]),
          med(c[k]) + med(m[k]) + med(a[k]) + med(u[k]) + med(r[k]));
    }
  }
  // Device memory of 50 pages of 20 MiB of each kind (as cuMemGetInfo sees it).
  for (int k = 0; k < 2; ++k) {
    size_t free0 = 0, free1 = 0, total = 0;
    std::vector<CUmemGenericAllocationHandle> hs(50);
    CK(cuMemGetInfo(&free0, &total));
    for (auto& h : hs) CK(cuMemCreate(&h, 20 << 20, kinds[k], 0));
    CK(cuMemGetInfo(&free1, &total));
    for (auto h : hs) CK(cuMemRelease(h));
    std::printf("50 pages of 20 MiB %-10s: %.1f MiB of device memory\n", names[k],
                (double)(free0 - free1) / (1 << 20));
  }
  // Ten 2 MiB mappings, one set-access over all of them.
  {
    std::vector<double> tot;
    for (int k = 0; k < 20; ++k) {
      CUmemGenericAllocationHandle h[10];
      CUdeviceptr at = va + (size_t)k * (64ULL << 20);
      double t0 = now_us();
      for (int i = 0; i < 10; ++i) {
        CK(cuMemCreate(&h[i], 2 << 20, &prop, 0));
        CK(cuMemMap(at + i * (2 << 20), 2 << 20, 0, h[i], 0));
      }
      CK(cuMemSetAccess(at, 20 << 20, &acc, 1));
      double t1 = now_us();
      tot.push_back(t1 - t0);
      for (int i = 0; i < 10; ++i) {
        CK(cuMemUnmap(at + i * (2 << 20), 2 << 20));
        CK(cuMemRelease(h[i]));
      }
    }
    std::sort(tot.begin(), tot.end());
    std::printf("ten 2 MiB creates+maps, one set_access over 20 MiB: %.1f us\n",
                tot[tot.size() / 2]);
  }
  return 0;
}
