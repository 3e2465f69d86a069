// The part of the exported dlsym that runs before anything else is ready (DESIGN §2). ASan
// and TSan call dlsym(RTLD_NEXT, "mmap") and the like while they initialize, and those calls
// reach our exported dlsym first: this file is compiled without sanitizer instrumentation
// (shim/CMakeLists.txt) and uses neither a guarded static (TSan intercepts __cxa_guard_*) nor
// any library call a sanitizer intercepts, so that those lookups work before the sanitizer
// does (issue 12: every preloading test of an ASan build, and `libtsan.so:libpoolshim.so
// /bin/true`, crashed at load). Only a driver name looked up in a real handle goes on to the
// instrumented code (poolshim_dlsym_hook in driver_hooks.cpp).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>

#include "real_driver.h"

extern "C" {
// The C library's dlsym: the trampoline (dlsym_trampoline.S) jumps to it. Written once
// (every writer stores the same value), read with acquire loads.
__attribute__((visibility("hidden"))) void* poolshim_real_dlsym = nullptr;
__attribute__((visibility("hidden"))) void* poolshim_dlsym_intercept(void* handle,
                                                                     const char* name);
__attribute__((visibility("hidden"))) void* poolshim_dlsym_hook(void* handle, const char* name);
}

namespace poolshim::shim {

DlsymFunction real_dlsym() {
  void* f = __atomic_load_n(&poolshim_real_dlsym, __ATOMIC_ACQUIRE);
  if (f != nullptr) return reinterpret_cast<DlsymFunction>(f);
  f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (f == nullptr) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  if (f == nullptr) {
    static const char message[] = "poolshim: fatal: cannot find the C library's dlsym\n";
    const ssize_t ignored = write(STDERR_FILENO, message, sizeof message - 1);
    (void)ignored;
    abort();
  }
  __atomic_store_n(&poolshim_real_dlsym, f, __ATOMIC_RELEASE);
  return reinterpret_cast<DlsymFunction>(f);
}

}  // namespace poolshim::shim

// Answers dlsym(handle, name) with our hook when `name` is a hooked driver entry point and
// the handle's answer is libcuda's own function; returns null for everything else, and the
// trampoline then jumps to the real dlsym with the caller's return address intact.
void* poolshim_dlsym_intercept(void* handle, const char* name) {
  poolshim::shim::real_dlsym();  // the trampoline's jump target, before it returns null
  // RTLD_DEFAULT and RTLD_NEXT search the global scope, where our exports already come first
  // for the callers they should: leave them to the real dlsym (and its caller-relative rules).
  if (name == nullptr || handle == RTLD_DEFAULT || handle == RTLD_NEXT) return nullptr;
  if (name[0] != 'c' || name[1] != 'u') return nullptr;
  return poolshim_dlsym_hook(handle, name);
}
