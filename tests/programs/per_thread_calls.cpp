// A driver-API program (linked against libcuda) that reaches the per-thread default stream in
// the way MODE names, between two allocations, and prints the results (no pointers):
//   per_thread_calls none | lookup | proc | dlsym | direct | legacy | explicit | explicit_proc |
//                    launch_legacy | launch_explicit | capture
// none: never; lookup: looks cuStreamSynchronize's `_ptsz` form up through cuGetProcAddress
// with the per-thread flag (as CUDA 13's runtime does at start in every program) and never
// calls it; proc: looks it up so and calls it; dlsym: finds it by name in libcuda.so.1 and calls
// it; direct: calls it by name (bound at link time). legacy: calls cuStreamSynchronize on the
// legacy stream; explicit: on CU_STREAM_PER_THREAD; explicit_proc: the same through the legacy
// variant that cuGetProcAddress hands out. launch_legacy / launch_explicit: cuLaunchKernel (its
// stream is the ninth argument, on the stack) on stream 0 / CU_STREAM_PER_THREAD, with a bogus
// function (the double runs no kernel: CUDA_ERROR_NOT_SUPPORTED once it has read the stream).
// capture: begins and ends a capture of CU_STREAM_PER_THREAD (hooked, not watched). The
// shim must take only a call on the per-thread stream for it in use (the exit record's
// legacy_only).
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

extern "C" CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream);

namespace {

using Synchronize = CUresult (*)(CUstream);

int reach(const char* mode) {
  if (std::strcmp(mode, "none") == 0) return CUDA_SUCCESS;
  if (std::strcmp(mode, "legacy") == 0) return cuStreamSynchronize(nullptr);
  if (std::strcmp(mode, "explicit") == 0) return cuStreamSynchronize(CU_STREAM_PER_THREAD);
  if (std::strncmp(mode, "launch_", 7) == 0) {
    const CUstream s = std::strcmp(mode, "launch_explicit") == 0 ? CU_STREAM_PER_THREAD : nullptr;
    return cuLaunchKernel(reinterpret_cast<CUfunction>(1), 1, 1, 1, 1, 1, 1, 0, s, nullptr,
                          nullptr);
  }
  if (std::strcmp(mode, "capture") == 0) {
    CUgraph graph = nullptr;
    const CUresult b =
        cuStreamBeginCapture(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    if (b != CUDA_SUCCESS) return b;
    const CUresult e = cuStreamEndCapture(CU_STREAM_PER_THREAD, &graph);
    if (e == CUDA_SUCCESS && graph != nullptr) cuGraphDestroy(graph);
    return e;
  }
  if (std::strcmp(mode, "explicit_proc") == 0) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (cuGetProcAddress("cuStreamSynchronize", &fn, 2000, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                         &status) != CUDA_SUCCESS ||
        fn == nullptr)
      return -4;
    return reinterpret_cast<Synchronize>(fn)(CU_STREAM_PER_THREAD);
  }
  if (std::strcmp(mode, "direct") == 0) return cuStreamSynchronize_ptsz(nullptr);
  if (std::strcmp(mode, "dlsym") == 0) {
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    auto fn = reinterpret_cast<Synchronize>(
        driver != nullptr ? dlsym(driver, "cuStreamSynchronize_ptsz") : nullptr);
    return fn != nullptr ? fn(nullptr) : -1;
  }
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult r = cuGetProcAddress("cuStreamSynchronize", &fn, 7000,
                                      CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status);
  if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || fn == nullptr) return -2;
  if (std::strcmp(mode, "lookup") == 0) return CUDA_SUCCESS;
  if (std::strcmp(mode, "proc") == 0) return reinterpret_cast<Synchronize>(fn)(nullptr);
  return -3;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "none";
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUdeviceptr a = 0, b = 0;
  const CUresult r1 = cuInit(0);
  const CUresult r2 = cuDeviceGet(&dev, 0);
  const CUresult r3 = cuDevicePrimaryCtxRetain(&ctx, dev);
  const CUresult r4 = cuCtxSetCurrent(ctx);
  const CUresult r5 = cuMemAlloc(&a, 1 << 20);
  const CUresult r6 = cuMemFree(a);
  const int reached = reach(mode);
  const CUresult r7 = cuMemAlloc(&b, 1 << 20);
  const CUresult r8 = cuMemFree(b);
  std::printf("per_thread_calls %s: %d %d %d %d %d %d %d %d %d\n", mode, r1, r2, r3, r4, r5, r6,
              reached, r7, r8);
  return reached == CUDA_SUCCESS || reached == CUDA_ERROR_NOT_SUPPORTED ||
                 reached == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
             ? 0
             : 1;
}
