#include "cuda_api.h"

#include <dlfcn.h>

namespace poolshim {

std::string DriverApi::load(const char* library, Lookup lookup) {
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return std::string("cannot load ") + library + ": " + (why ? why : "unknown error");
  }
#define POOLSHIM_DRIVER_RESOLVE(name)                                \
  name = reinterpret_cast<decltype(&::name)>(lookup(handle, #name)); \
  if (name == nullptr) return std::string(library) + " has no " #name " (driver too old?)";
  POOLSHIM_DRIVER_FUNCTIONS(POOLSHIM_DRIVER_RESOLVE)
#undef POOLSHIM_DRIVER_RESOLVE
  const CUresult r = cuInit(0);
  if (r != CUDA_SUCCESS) return std::string("cuInit failed: ") + error_name(r);
  return {};
}

const char* DriverApi::error_name(CUresult r) const {
  const char* name = nullptr;
  if (cuGetErrorName != nullptr && cuGetErrorName(r, &name) == CUDA_SUCCESS && name != nullptr) {
    return name;
  }
  return "CUDA_ERROR_UNKNOWN_CODE";
}

}  // namespace poolshim
