// Looks up every variant of the driver entry points the shim hooks, at every version and with
// every flag the CUDA 13 headers define (cudaTypedefs.h), through cuGetProcAddress_v2 found
// the way the runtime finds it (dlopen + dlsym), and prints which function each answer is.
// Under the shim, the answer for a hooked variant must be the shim's hook of exactly that
// variant; for a per-thread variant the shim does not hook, a watching thunk; every other
// answer the driver's own.
//   proc_address      lines "name version flags -> result variant owner"
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

namespace {

struct Query {
  const char* name;
  int version;
};

// Versions from the PFN_<name>_v<version> typedefs of cudaTypedefs.h (CUDA 13.0), plus 13000.
const Query kQueries[] = {
    {"cuMemAlloc", 2000},
    {"cuMemAlloc", 3020},
    {"cuMemAlloc", 13000},
    {"cuMemFree", 2000},
    {"cuMemFree", 3020},
    {"cuMemFree", 13000},
    {"cuMemGetInfo", 2000},
    {"cuMemGetInfo", 3020},
    {"cuMemGetInfo", 13000},
    {"cuMemAllocAsync", 11020},
    {"cuMemAllocAsync", 13000},
    {"cuMemFreeAsync", 11020},
    {"cuMemFreeAsync", 13000},
    {"cuMemAllocFromPoolAsync", 11020},
    {"cuDeviceSetMemPool", 11020},
    {"cuDevicePrimaryCtxReset", 7000},
    {"cuDevicePrimaryCtxReset", 11000},
    {"cuStreamCreate", 2000},
    {"cuStreamCreateWithPriority", 5050},
    {"cuStreamDestroy", 2000},
    {"cuStreamDestroy", 4000},
    {"cuStreamBeginCapture", 10000},
    {"cuStreamBeginCapture", 10010},
    {"cuStreamBeginCaptureToGraph", 12030},
    {"cuStreamEndCapture", 10000},
    {"cuCtxCreate", 3020},
    {"cuCtxCreate", 11040},
    {"cuCtxCreate", 12050},
    {"cuGetProcAddress", 11030},
    {"cuGetProcAddress", 12000},
    {"cuCtxEnablePeerAccess", 4000},
    {"cuIpcGetMemHandle", 4010},
    {"cuGreenCtxCreate", 12040},
    {"cuMemcpy", 4000},
    {"cuMemcpy", 7000},
    {"cuStreamSynchronize", 2000},
    {"cuStreamSynchronize", 7000},
    {"cuLaunchKernel", 4000},
    {"cuLaunchKernel", 7000},
};

const cuuint64_t kFlags[] = {CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};

const char* owner(const char* file) {
  if (file == nullptr) return "none";
  if (std::strstr(file, "libpoolshim") != nullptr) return "poolshim";
  if (std::strstr(file, "libcuda") != nullptr) return "driver";
  return "other";
}

}  // namespace

int main() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) return 4;
  auto get = reinterpret_cast<decltype(&cuGetProcAddress_v2)>(dlsym(driver, "cuGetProcAddress_v2"));
  auto init = reinterpret_cast<decltype(&cuInit)>(dlsym(driver, "cuInit"));
  if (get == nullptr || init == nullptr || init(0) != CUDA_SUCCESS) return 5;
  for (const Query& q : kQueries) {
    for (cuuint64_t flags : kFlags) {
      void* fn = nullptr;
      CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
      const CUresult r = get(q.name, &fn, q.version, flags, &status);
      Dl_info info{};
      const bool known = fn != nullptr && dladdr(fn, &info) != 0;
      std::printf("%s %d %llu -> %d %d %s %s\n", q.name, q.version,
                  static_cast<unsigned long long>(flags), r, status,
                  known && info.dli_sname ? info.dli_sname : "-",
                  known ? owner(info.dli_fname) : "none");
    }
  }
  return 0;
}
