// Raising an atomic to a value, never lowering it: peaks, and numbers that only move forward.
#pragma once

#include <atomic>
#include <cstdint>

namespace poolshim {

/// Makes `a` at least `value` (a compare-exchange loop; no lock). `order` is the ordering of
/// the successful exchange.
inline void raise_to(std::atomic<std::uint64_t>& a, std::uint64_t value,
                     std::memory_order order = std::memory_order_relaxed) {
  std::uint64_t seen = a.load(std::memory_order_relaxed);
  while (value > seen && !a.compare_exchange_weak(seen, value, order, std::memory_order_relaxed)) {
  }
}

}  // namespace poolshim
