// A small test-and-test-and-set lock for short critical sections (a few dozen instructions),
// where a futex-based mutex would cost more than the work it protects.
#pragma once

#include <sched.h>
#include <atomic>

namespace poolshim {

class SpinLock {
 public:
  void lock() {
    for (int spins = 0;; ++spins) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      while (locked_.load(std::memory_order_relaxed)) {
        if (spins < 64) {
          __builtin_ia32_pause();
          ++spins;
        } else {
          sched_yield();  // the holder may have been preempted
        }
      }
    }
  }
  bool try_lock() { return !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace poolshim
