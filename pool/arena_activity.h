// Which of a device heap's arenas serve requests lately (DESIGN §7). A request marks its arena
// used; the background worker's tick turns, once a period at most, every arena that saw no
// request since the previous turn idle. A live thread's arena lends its free memory to other
// threads' growing requests only while idle (DeviceHeap::Lend::idle): the free memory of an
// arena in use is its thread's working set, and taking it makes the owner miss in turn, each
// miss locking the other's arena and polling fences (seen over the CPU double: 8458 fences in
// 840k pairs on 4 threads, against 4 on one). An idle thread's memory serves others until it
// allocates again, and the background trim gives it back meanwhile.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "arena_claims.h"

namespace poolshim {

class ArenaActivity {
 public:
  /// The shortest time without a request that makes an arena idle: a turn comes at most this
  /// often, and an arena is idle after one whole turn without a request.
  static constexpr std::uint64_t kPeriodNs = 250'000'000;

  /// A request of `arena`: used in this period, and no longer idle. Two relaxed loads; stores
  /// only on the first request of a period (the owner's cache line stays its own).
  void note_use(int arena) {
    Slot& s = slots_[static_cast<std::size_t>(arena)];
    if (!s.used.load(std::memory_order_relaxed) || s.idle.load(std::memory_order_relaxed)) {
      s.used.store(true, std::memory_order_relaxed);
      s.idle.store(false, std::memory_order_relaxed);
    }
  }
  /// Whether `arena` saw no request during the last whole period.
  bool idle(int arena) const {
    return slots_[static_cast<std::size_t>(arena)].idle.load(std::memory_order_relaxed);
  }
  /// Turns the period when at least kPeriodNs have passed since the last turn (the first call
  /// turns at once): arenas used since then stay active, the others become idle. Returns
  /// whether it turned. One caller at a time (the background worker).
  bool tick(std::uint64_t now_ns);

 private:
  struct alignas(64) Slot {
    std::atomic<bool> used{false};
    std::atomic<bool> idle{false};
  };
  std::array<Slot, kHeapArenas> slots_{};
  std::uint64_t turned_at_ = 0;
  bool turned_ = false;
};

}  // namespace poolshim
