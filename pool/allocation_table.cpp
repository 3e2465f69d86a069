#include "allocation_table.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

namespace poolshim {

namespace {

// Slots of a new shard: 64 (4 KiB, a page; 4 MiB of address space for the 1024 shards, of which
// only the shards in use take memory), so that the table of a program with few live
// allocations stays in the CPU's caches. The heap hands out ever-changing addresses, which land
// on random slots of their shard: with 8192 slots a shard (32 MiB in all) every insert and
// lookup missed the caches (a third of a cudaMallocAsync+cudaFreeAsync pair's time, over the
// CPU double). A shard doubles when half full.
constexpr std::size_t kInitialCapacity = 64;

void* map_slots(std::size_t count, std::size_t slot_size) {
  void* p =
      mmap(nullptr, count * slot_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();  // out of host address space: nothing sane is left to do
  return p;
}

}  // namespace

AllocationTable::AllocationTable() {
  // One mapping for every shard's first slots: 1024 mappings would cost the process as many
  // of its map areas.
  initial_ = static_cast<Slot*>(map_slots(kShards * kInitialCapacity, sizeof(Slot)));
  for (int i = 0; i < kShards; ++i) {
    Shard& s = shards_[i];
    s.capacity = kInitialCapacity;
    s.slots = initial_ + static_cast<std::size_t>(i) * kInitialCapacity;  // zero-filled
  }
}

AllocationTable::~AllocationTable() {
  for (auto& s : shards_) {
    if (s.capacity != kInitialCapacity) munmap(s.slots, s.capacity * sizeof(Slot));
  }
  munmap(initial_, kShards * kInitialCapacity * sizeof(Slot));
}

std::uint64_t AllocationTable::hash(std::uintptr_t ptr) {
  // Device pointers are at least 256-byte aligned: drop the always-zero bits, then mix.
  std::uint64_t x = static_cast<std::uint64_t>(ptr) >> 8;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

std::size_t AllocationTable::shard_index(std::uintptr_t ptr) {
  // A granule's blocks share a shard. The granule number's low bits pick it, so that the
  // granules of one 2 GiB-aligned range all differ; the higher bits are folded in, so that
  // segments at the same offset of different ranges (a pool's reservations) spread too.
  const std::uint64_t g = static_cast<std::uint64_t>(ptr) >> 21;
  return static_cast<std::size_t>((g ^ (g >> 10) ^ (g >> 20) ^ (g >> 30)) & (kShards - 1));
}

void AllocationTable::insert_unlocked(Shard& s, std::uintptr_t key, const Allocation& value,
                                      std::uint64_t h) {
  const std::size_t mask = s.capacity - 1;
  std::size_t i = h & mask;
  while (s.slots[i].key != 0) i = (i + 1) & mask;
  s.slots[i].key = key;
  s.slots[i].value = value;
  ++s.count;
}

void AllocationTable::grow(Shard& s) {
  Slot* old = s.slots;
  const std::size_t old_capacity = s.capacity;
  s.capacity = old_capacity * 2;
  s.slots = static_cast<Slot*>(map_slots(s.capacity, sizeof(Slot)));
  s.count = 0;
  for (std::size_t i = 0; i < old_capacity; ++i) {
    if (old[i].key != 0) insert_unlocked(s, old[i].key, old[i].value, hash(old[i].key));
  }
  if (old_capacity == kInitialCapacity) {
    // Part of the shared first mapping: its memory goes back (where it is whole pages), its
    // addresses stay reserved until the table goes.
    static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t bytes = old_capacity * sizeof(Slot);
    if (bytes % page == 0) madvise(old, bytes, MADV_DONTNEED);
  } else {
    munmap(old, old_capacity * sizeof(Slot));
  }
}

// Backward-shift deletion keeps linear probing free of tombstones.
void AllocationTable::erase_at(Shard& s, std::size_t index) {
  const std::size_t mask = s.capacity - 1;
  std::size_t hole = index;
  std::size_t i = (index + 1) & mask;
  while (s.slots[i].key != 0) {
    const std::size_t home = hash(s.slots[i].key) & mask;
    // Move slot i into the hole unless its home lies cyclically in (hole, i].
    const bool home_after_hole = ((i - home) & mask) < ((i - hole) & mask);
    if (!home_after_hole) {
      s.slots[hole] = s.slots[i];
      hole = i;
    }
    i = (i + 1) & mask;
  }
  s.slots[hole].key = 0;
  --s.count;
}

void AllocationTable::insert(std::uintptr_t ptr, const Allocation& a) {
  const std::uint64_t h = hash(ptr);
  Shard& s = shard_of(ptr);
  std::lock_guard<SpinLock> guard(s.lock);
  if ((s.count + 1) * 2 > s.capacity) grow(s);  // keep the load under one half
  insert_unlocked(s, ptr, a, h);
}

AllocationTable::Slot* AllocationTable::slot_of(const Shard& s, std::uintptr_t key,
                                                std::uint64_t h) {
  const std::size_t mask = s.capacity - 1;
  for (std::size_t i = h & mask; s.slots[i].key != 0; i = (i + 1) & mask) {
    if (s.slots[i].key == key) return &s.slots[i];
  }
  return nullptr;
}

std::optional<Allocation> AllocationTable::take(std::uintptr_t ptr) {
  const std::uint64_t h = hash(ptr);
  Shard& s = shard_of(ptr);
  std::lock_guard<SpinLock> guard(s.lock);
  Slot* slot = slot_of(s, ptr, h);
  if (slot == nullptr) return std::nullopt;
  Allocation a = slot->value;
  erase_at(s, static_cast<std::size_t>(slot - s.slots));
  return a;
}

std::optional<Allocation> AllocationTable::find(std::uintptr_t ptr) const {
  const std::uint64_t h = hash(ptr);
  const Shard& s = shard_of(ptr);
  std::lock_guard<SpinLock> guard(s.lock);
  const Slot* slot = slot_of(s, ptr, h);
  if (slot == nullptr) return std::nullopt;
  return slot->value;
}

std::optional<Allocation> AllocationTable::add_flags(std::uintptr_t ptr, std::uint32_t flags) {
  const std::uint64_t h = hash(ptr);
  Shard& s = shard_of(ptr);
  std::lock_guard<SpinLock> guard(s.lock);
  Slot* slot = slot_of(s, ptr, h);
  if (slot == nullptr) return std::nullopt;
  slot->value.flags |= flags;
  return slot->value;
}

void AllocationTable::drop_device(
    int device, const std::function<void(std::uintptr_t, const Allocation&)>& dropped) {
  for (auto& s : shards_) {
    std::lock_guard<SpinLock> guard(s.lock);
    // Restart the scan after each erase: backward shifts move later slots into earlier ones.
    for (std::size_t i = 0; i < s.capacity;) {
      if (s.slots[i].key != 0 && s.slots[i].value.device == device) {
        dropped(s.slots[i].key, s.slots[i].value);
        erase_at(s, i);
        continue;  // slot i now holds a shifted entry (or is empty): look at it again
      }
      ++i;
    }
  }
}

void AllocationTable::for_each(
    const std::function<void(std::uintptr_t, const Allocation&)>& visit) const {
  for (const auto& s : shards_) {
    std::lock_guard<SpinLock> guard(s.lock);
    for (std::size_t i = 0; i < s.capacity; ++i) {
      if (s.slots[i].key != 0) visit(s.slots[i].key, s.slots[i].value);
    }
  }
}

std::size_t AllocationTable::size() const {
  std::size_t n = 0;
  for (const auto& s : shards_) {
    std::lock_guard<SpinLock> guard(s.lock);
    n += s.count;
  }
  return n;
}

}  // namespace poolshim
