#include "real_runtime.h"

#include "real_driver.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <string>

namespace poolshim::real {

namespace {

std::atomic<void*> g_resolved[static_cast<int>(Function::count)];

void* lookup(const char* name) {
  // The next definition after ours in the global scope: the runtime the program linked.
  if (void* f = poolshim::shim::real_dlsym()(RTLD_NEXT, name)) return f;
  // A runtime loaded with local scope (a Python extension's dependency, say) is not in the
  // global scope, but the program's calls still bind to our hooks: find it by its soname.
  for (const char* soname : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    void* handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    void* f = poolshim::shim::real_dlsym()(handle, name);
    dlclose(handle);  // RTLD_NOLOAD took a reference; the library stays loaded
    if (f != nullptr) return f;
  }
  return nullptr;
}

}  // namespace

void* resolve(Function f, const char* name, void* missing) {
  std::atomic<void*>& slot = g_resolved[static_cast<int>(f)];
  void* p = slot.load(std::memory_order_acquire);
  if (p != nullptr) return p;
  p = lookup(name);
  if (p == nullptr) {
    const std::string text = std::string("poolshim: warning: no loaded CUDA runtime defines ") +
                             name + "; the call fails with cudaErrorSharedObjectSymbolNotFound\n";
    const ssize_t ignored = write(STDERR_FILENO, text.data(), text.size());
    (void)ignored;
    p = missing;
  }
  slot.store(p, std::memory_order_release);
  return p;
}

}  // namespace poolshim::real
