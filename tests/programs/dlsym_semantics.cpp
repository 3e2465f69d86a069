// dlsym must behave exactly as without the shim for every name it does not answer itself, and
// RTLD_NEXT must stay relative to the caller (DESIGN §2). Standard output is compared with
// and without the shim; the answer for a hooked driver name goes to stderr.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

int main() {
  int devices = 0;
  cudaGetDeviceCount(&devices);  // the program uses the runtime: libcudart is loaded
  // From the executable, RTLD_NEXT starts right after it: the same first definition that
  // RTLD_DEFAULT finds (the shim's, when preloaded; the runtime's otherwise). A dlsym wrapper
  // that looked up RTLD_NEXT from its own library would find the runtime's instead.
  void* next = dlsym(RTLD_NEXT, "cudaMalloc");
  void* first = dlsym(RTLD_DEFAULT, "cudaMalloc");
  std::printf("rtld_next_is_caller_relative: %d\n", next != nullptr && next == first);

  dlerror();
  void* missing = dlsym(RTLD_DEFAULT, "poolshim_no_such_symbol");
  const char* error = dlerror();
  std::printf("missing: null=%d error_mentions_name=%d\n", missing == nullptr,
              error != nullptr && std::strstr(error, "poolshim_no_such_symbol") != nullptr);

  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  std::printf("libc_handle_lookup: %d\n", libc != nullptr && dlsym(libc, "strlen") == &strlen);

  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  void* init = driver != nullptr ? dlsym(driver, "cuInit") : nullptr;
  Dl_info info{};
  std::printf("unhooked_driver_name_from_driver: %d\n",
              init != nullptr && dladdr(init, &info) != 0 &&
                  std::strstr(info.dli_fname, "libcuda") != nullptr);
  void* alloc = driver != nullptr ? dlsym(driver, "cuMemAlloc_v2") : nullptr;
  if (alloc != nullptr && dladdr(alloc, &info) != 0) {
    std::fprintf(stderr, "cuMemAlloc_v2 from %s\n",
                 std::strstr(info.dli_fname, "libpoolshim") ? "poolshim" : "driver");
  }
  return 0;
}
