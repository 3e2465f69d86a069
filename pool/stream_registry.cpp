#include "stream_registry.h"

#include <mutex>

namespace poolshim {

void StreamRegistry::add(const Entry& entry) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  entries_.push_back(entry);
  if (entry.event == nullptr) eventless_.fetch_add(1, std::memory_order_release);
  listed_.fetch_add(1, std::memory_order_seq_cst);
}

void StreamRegistry::drop_device(int device) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  std::vector<Entry> kept;
  for (const auto& e : entries_) {
    if (e.device != device) {
      kept.push_back(e);
    } else if (e.event == nullptr) {
      eventless_.fetch_sub(1, std::memory_order_release);
    }
  }
  entries_.swap(kept);
  listed_.store(static_cast<int>(entries_.size()), std::memory_order_seq_cst);
}

std::size_t StreamRegistry::size() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace poolshim
