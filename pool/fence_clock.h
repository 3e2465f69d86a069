// FenceClock: the fences of one device (DESIGN §3, §7). A block freed in some stream's order may
// still be used by work queued before its free, on any stream. A *fence* is a device-wide point
// after the free: a synchronization of the device, or an event recorded behind every stream of
// the device (and completed). Fences are numbered; a block remembers the number of the first fence
// issued after its free (`ready_at`), and any stream may use it once every fence up to that
// number has completed.
#pragma once

#include <atomic>
#include <cstdint>

#include "atomic_max.h"

namespace poolshim {

class FenceClock {
 public:
  /// Number of the fence being started now: every free before this call is covered by it.
  std::uint64_t start() { return issued_.fetch_add(1, std::memory_order_acq_rel) + 1; }
  /// Fence `k` has completed (and with it every earlier one: a later fence covers all work
  /// an earlier one covers).
  void complete(std::uint64_t k) { raise_to(completed_, k, std::memory_order_release); }
  /// The fence that will cover a free made now: the next one to start.
  std::uint64_t next() const { return issued_.load(std::memory_order_acquire) + 1; }
  std::uint64_t completed() const { return completed_.load(std::memory_order_acquire); }
  std::uint64_t issued() const { return issued_.load(std::memory_order_acquire); }

 private:
  std::atomic<std::uint64_t> issued_{0};
  std::atomic<std::uint64_t> completed_{0};
};

}  // namespace poolshim
