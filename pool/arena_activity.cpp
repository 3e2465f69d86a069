#include "arena_activity.h"

namespace poolshim {

bool ArenaActivity::tick(std::uint64_t now_ns) {
  if (turned_ && now_ns - turned_at_ < kPeriodNs) return false;
  turned_ = true;
  turned_at_ = now_ns;
  for (Slot& s : slots_) {
    // A request racing this turn may see its arena marked idle for one period (its next
    // request clears that): it lends for a while, which costs speed, never correctness.
    s.idle.store(!s.used.exchange(false, std::memory_order_relaxed), std::memory_order_relaxed);
  }
  return true;
}

}  // namespace poolshim
