// Peer access the application enabled (DESIGN §3): device `from` may reach device `to`'s
// memory, so `to`'s pool must be opened to `from` (cudaMemPoolSetAccess), including a pool
// made after the access was enabled. Recorded by the shim's hooks, before the core may exist.
#pragma once

#include <atomic>
#include <vector>

namespace poolshim {

class PeerAccess {
 public:
  static constexpr int kDevices = 64;

  void enable(int from, int to) {
    if (valid(from) && valid(to)) pairs_[to][from].store(true, std::memory_order_release);
  }
  /// The devices that may reach `to`'s memory.
  std::vector<int> accessors(int to) const {
    std::vector<int> out;
    if (!valid(to)) return out;
    for (int from = 0; from < kDevices; ++from) {
      if (pairs_[to][from].load(std::memory_order_acquire)) out.push_back(from);
    }
    return out;
  }
  bool any() const {
    for (const auto& row : pairs_) {
      for (const auto& cell : row) {
        if (cell.load(std::memory_order_relaxed)) return true;
      }
    }
    return false;
  }

 private:
  static bool valid(int d) { return d >= 0 && d < kDevices; }
  std::atomic<bool> pairs_[kDevices][kDevices]{};
};

}  // namespace poolshim
