// The free mode a process runs in (the `free` option, DESIGN §3): `sync` and `ordered` as asked;
// `auto` (the default) is `ordered` where the shim can tell that nothing relies on cudaFree
// synchronizing the device, and `sync` otherwise. It can tell for PyTorch: its CUDA library
// (libc10_cuda.so) is loaded before the process's first device-memory call, and PyTorch orders
// its memory by streams itself (its caching allocator never calls cudaFree in steady state, and
// with the cache off it frees a tensor only once its stream's work is enqueued).
#pragma once

#include <string>
#include <vector>

namespace poolshim {

struct FreeMode {
  bool ordered = false;
  std::string why;  // for the start record and README's wording: what chose it
};

/// The mode for option value `option` ("sync", "ordered" or "auto") in a process whose loaded
/// libraries are `libraries` (paths or names).
FreeMode resolve_free_mode(const std::string& option, const std::vector<std::string>& libraries);
/// The paths of the libraries loaded in this process (dl_iterate_phdr).
std::vector<std::string> loaded_libraries();

}  // namespace poolshim
