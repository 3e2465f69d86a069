#include "stream_registry.h"

namespace poolshim {

void StreamRegistry::add(CUstream stream, int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back(Entry{stream, device, nullptr});
}

bool StreamRegistry::remove(CUstream stream, Entry* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->stream == stream) {
      *out = *it;
      entries_.erase(it);
      return true;
    }
  }
  return false;
}

std::size_t StreamRegistry::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace poolshim
