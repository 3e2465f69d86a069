// SharedSlack: one budget of mapped free pages for all of a device heap's paged arenas
// (DESIGN §7). Each paged arena may keep pages mapped beyond its blocks in use (its excess), so
// that a request finds them at once; with one budget per arena, sixteen live threads could hold
// sixteen times `cache` (seen on an H200: 720-840 MiB reserved for 70-110 MiB live with 16
// threads, 416 MiB for about 45 MiB with 8, for seconds on end: the background trim cannot take
// pages under blocks freed since the last fence). Shared, an arena's allowance is the budget less
// what the other arenas already hold: past it, a request moves its own arena's free pages instead
// of making new ones. The sum is taken on demand (a request that must map pages), so the hot
// path writes nothing shared.
#pragma once

#include <array>
#include <cstdint>

namespace poolshim {

class SharedSlack {
 public:
  static constexpr int kMaxMembers = 32;

  explicit SharedSlack(std::uint64_t budget) : budget_(budget) {}

  /// Adds a member whose excess (mapped bytes beyond its blocks in use) `excess` reads,
  /// lock-free. Before any request (the heap's construction). Returns its index, or -1 when
  /// full.
  template <typename Member>
  int join(const Member* m) {
    if (count_ >= kMaxMembers) return -1;
    members_[static_cast<std::size_t>(count_)] =
        Entry{m, [](const void* p) { return static_cast<const Member*>(p)->paged_excess(); }};
    return count_++;
  }

  /// What member `self` may hold mapped beyond its blocks in use: the budget less the other
  /// members' excess (0 when they hold it all).
  std::uint64_t allowance(int self) const;

 private:
  struct Entry {
    const void* member = nullptr;
    std::uint64_t (*excess)(const void*) = nullptr;
  };
  std::uint64_t budget_;
  std::array<Entry, kMaxMembers> members_{};
  int count_ = 0;
};

}  // namespace poolshim
