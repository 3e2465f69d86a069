#include "free_mode.h"

#include <link.h>

namespace poolshim {

FreeMode resolve_free_mode(const std::string& option, const std::vector<std::string>& libraries) {
  if (option == "ordered") return {true, "free=ordered"};
  if (option == "sync") return {false, "free=sync"};
  for (const std::string& path : libraries) {
    const std::size_t slash = path.rfind('/');
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    if (name.rfind("libc10_cuda.so", 0) == 0) {
      return {true, "free=auto: ordered, PyTorch's " + name + " is loaded"};
    }
  }
  return {false, "free=auto: sync, no library known to order its frees by streams is loaded"};
}

std::vector<std::string> loaded_libraries() {
  std::vector<std::string> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') {
          static_cast<std::vector<std::string>*>(data)->emplace_back(info->dlpi_name);
        }
        return 0;
      },
      &out);
  return out;
}

}  // namespace poolshim
