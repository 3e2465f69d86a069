#include "device_heap.h"

#include <algorithm>
#include <atomic>

namespace poolshim {

DeviceHeap::DeviceHeap(SegmentSource& source, const Paging& paging) : slack_(paging.slack) {
  for (int i = 0; i < kArenas; ++i) {
    if (paging.physical != nullptr) {
      pages_[i] = std::make_unique<PageMap>(*paging.physical, paging.page, paging.span);
    }
    arenas_[i] = std::make_unique<SegmentAllocator>(source, pages_[i].get(), paging.slack);
    // One budget of mapped free pages for all the paged arenas (shared_slack.h).
    if (pages_[i]) arenas_[i]->share_slack(&slack_, slack_.join(arenas_[i].get()));
  }
}

void DeviceHeap::release_pages() {
  for (auto& p : pages_) {
    if (p) p->release();
  }
}

std::uint64_t DeviceHeap::pages_held(std::uint64_t* peak) const {
  std::uint64_t held = 0;
  std::uint64_t high = 0;
  for (const auto& p : pages_) {
    if (!p) continue;
    held += p->held_bytes();
    high += p->held_peak();
  }
  if (peak != nullptr) *peak = high;
  return held;
}

int DeviceHeap::arena_for(std::uintptr_t token) {
  return token <= 1 ? 0 : thread_arena();  // 0: cudaMalloc without a token, the legacy stream
}

bool DeviceHeap::may_take(int i, int own, int mine, Lend lend) const {
  if (i == own || i == mine || lend == Lend::any) return true;
  if (arena_claims().holders(i) == 0) return true;
  return lend == Lend::idle && activity_.idle(i);
}

template <typename F>
bool DeviceHeap::any_reachable(std::uintptr_t token, Lend lend, F&& f) const {
  const int own = arena_for(token);
  const int mine = thread_arena_if_claimed();
  for (int i = 0; i < kArenas; ++i) {
    if (may_take(i, own, mine, lend) && f(i)) return true;
  }
  return false;
}

const PageMap* DeviceHeap::pages_of(CUdeviceptr p) const {
  for (const auto& pages : pages_) {
    if (pages != nullptr && pages->contains(p)) return pages.get();
  }
  return nullptr;
}

bool DeviceHeap::allocate_from_free(std::uint64_t bytes, std::uintptr_t token,
                                    std::uint64_t completed, Block* out, Lend lend) {
  const int own = arena_for(token);
  activity_.note_use(own);
  SegmentAllocator::Block b;
  if (arenas_[own]->allocate_from_free(bytes, token, completed, &b)) {
    *out = from(b, own);
    return true;
  }
  return any_reachable(token, lend, [&](int i) {
    // An arena that holds less free memory than the request cannot serve it: skip its lock.
    if (i == own || arenas_[i]->free_bytes() < bytes) return false;
    if (!arenas_[i]->allocate_from_free(bytes, token, completed, &b)) return false;
    *out = from(b, i);
    return true;
  });
}

bool DeviceHeap::allocate(std::uint64_t bytes, std::uintptr_t token, std::uint64_t completed,
                          Block* out, CUresult* why) {
  const int own = arena_for(token);
  SegmentAllocator::Block b;
  if (!arenas_[own]->allocate(bytes, token, completed, &b, why)) return false;
  *out = from(b, own);
  return true;
}

void DeviceHeap::free(int arena, void* node, std::uint64_t size, std::uintptr_t token,
                      std::uint64_t ready_at, std::uint64_t completed) {
  arenas_[arena]->free(SegmentAllocator::Block{0, size, node, 0}, token, ready_at, completed);
}

std::uint64_t DeviceHeap::trim(std::uint64_t keep, std::uint64_t completed) {
  std::uint64_t released = 0;
  for (auto& a : arenas_) {
    const std::uint64_t total = reserved();
    if (total <= keep) break;
    const std::uint64_t others = total - a->stats().reserved;
    // This arena may keep what the others do not already use of `keep`.
    released += a->trim(keep > others ? keep - others : 0, completed);
  }
  return released;
}

std::uint64_t DeviceHeap::coalesce(std::uint64_t completed, std::uintptr_t token, Lend lend) {
  std::uint64_t merges = 0;
  any_reachable(token, lend, [&](int i) {
    if (arenas_[i]->free_bytes() > 0) merges += arenas_[i]->coalesce(completed);
    return false;
  });
  return merges;
}

std::uint64_t DeviceHeap::free_bytes(std::uintptr_t token, Lend lend) const {
  std::uint64_t n = 0;
  any_reachable(token, lend, [&](int i) {
    n += arenas_[i]->free_bytes();
    return false;
  });
  return n;
}

bool DeviceHeap::waiting(std::uint64_t completed, std::uintptr_t token, Lend lend) const {
  return any_reachable(token, lend, [&](int i) { return arenas_[i]->waiting(completed); });
}

void DeviceHeap::forget_affinity(std::uintptr_t token) {
  for (auto& a : arenas_) a->forget_affinity(token);
}

void DeviceHeap::clear() {
  for (auto& a : arenas_) a->clear();
}

std::uint64_t DeviceHeap::free_bytes() const {
  std::uint64_t n = 0;
  for (const auto& a : arenas_) n += a->free_bytes();
  return n;
}

std::uint64_t DeviceHeap::free_peak() const {
  std::uint64_t n = 0;
  for (const auto& a : arenas_) n += a->free_peak();
  return n;
}

bool DeviceHeap::waiting(std::uint64_t completed) const {
  for (const auto& a : arenas_) {
    if (a->waiting(completed)) return true;
  }
  return false;
}

std::uint64_t DeviceHeap::allocated() const {
  std::uint64_t n = 0;
  for (const auto& a : arenas_) n += a->allocated_bytes();
  return n;
}

SegmentAllocator::Stats DeviceHeap::stats() const {
  SegmentAllocator::Stats sum;
  for (const auto& a : arenas_) {
    const SegmentAllocator::Stats s = a->stats();
    sum.reserved += s.reserved;
    sum.allocated += s.allocated;
    sum.segments += s.segments;
    sum.free_blocks += s.free_blocks;
    sum.largest_free = std::max(sum.largest_free, s.largest_free);
    sum.free_peak += s.free_peak;
    sum.reserved_peak += s.reserved_peak;
    sum.allocated_peak += s.allocated_peak;
    sum.splits += s.splits;
    sum.merges += s.merges;
    sum.segments_reserved += s.segments_reserved;
    sum.segments_released += s.segments_released;
  }
  return sum;
}

}  // namespace poolshim
