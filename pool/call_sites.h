// Call sites of allocations (POOLSHIM_BACKTRACE=N): the hot path captures up to N return
// addresses and interns them here, keeping a 32-bit id in the allocation's table entry. No
// symbolization and no allocation on the hot path: the table is one mmap'd array of fixed
// slots claimed with a compare-and-swap; names are resolved when a report is written.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace poolshim {

constexpr int kMaxCallSiteFrames = 32;

class CallSiteTable {
 public:
  /// `capacity` distinct call sites (a power of two); more are recorded as unknown (id 0).
  explicit CallSiteTable(std::size_t capacity = std::size_t{1} << 16);
  ~CallSiteTable();
  CallSiteTable(const CallSiteTable&) = delete;
  CallSiteTable& operator=(const CallSiteTable&) = delete;

  /// The id of this sequence of return addresses (innermost first), interning it on first
  /// sight. 0 when `depth` is 0 or the table is full.
  std::uint32_t intern(const std::uintptr_t* frames, int depth);
  /// The frames of `id`; empty for 0 or an unknown id.
  std::vector<std::uintptr_t> frames(std::uint32_t id) const;
  /// Call sites that did not fit (recorded as id 0).
  std::uint64_t overflowed() const { return overflowed_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    std::atomic<std::uint64_t> hash;  // 0 = free
    std::atomic<bool> ready;          // frames written
    std::int32_t depth;
    std::uintptr_t frames[kMaxCallSiteFrames];
  };
  Slot* slots_ = nullptr;
  std::size_t capacity_ = 0;
  std::atomic<std::uint64_t> overflowed_{0};
};

/// Captures the calling thread's return addresses (innermost first) into `out` (at most
/// `max_frames`), leaving out the leading frames that lie in [skip_begin, skip_end) (the
/// shim's own code). Returns how many were stored.
int capture_frames(std::uintptr_t* out, int max_frames, std::uintptr_t skip_begin,
                   std::uintptr_t skip_end);

/// Loads the unwinder once (backtrace() dlopens libgcc_s and allocates on its first call):
/// call before the hot path captures anything.
void warm_up_unwinder();

}  // namespace poolshim
