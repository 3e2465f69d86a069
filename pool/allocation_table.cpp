#include "allocation_table.h"

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>

namespace poolshim {

namespace {

// Slots of a new shard: 256 (16 KiB; 1 MiB for the 64 shards), so that the table of a program
// with few live allocations stays in the CPU's caches. The heap hands out ever-changing
// addresses, which land on random slots: with 8192 slots a shard (32 MiB in all) every insert
// and lookup missed the caches (a third of a cudaMallocAsync+cudaFreeAsync pair's time, over
// the CPU double). A shard doubles when half full.
constexpr std::size_t kInitialCapacity = 256;

void* map_slots(std::size_t count, std::size_t slot_size) {
  void* p =
      mmap(nullptr, count * slot_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();  // out of host address space: nothing sane is left to do
  return p;
}

}  // namespace

AllocationTable::AllocationTable() {
  for (auto& s : shards_) {
    s.capacity = kInitialCapacity;
    s.slots = static_cast<Slot*>(map_slots(s.capacity, sizeof(Slot)));  // zero-filled
  }
}

AllocationTable::~AllocationTable() {
  for (auto& s : shards_) munmap(s.slots, s.capacity * sizeof(Slot));
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

AllocationTable::Shard& AllocationTable::shard_for(Shard* shards, std::uint64_t h) {
  return shards[h >> 58];  // top 6 bits: 64 shards; the low bits index slots
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
  munmap(old, old_capacity * sizeof(Slot));
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
  Shard& s = shard_for(shards_, h);
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
  Shard& s = shard_for(shards_, h);
  std::lock_guard<SpinLock> guard(s.lock);
  Slot* slot = slot_of(s, ptr, h);
  if (slot == nullptr) return std::nullopt;
  Allocation a = slot->value;
  erase_at(s, static_cast<std::size_t>(slot - s.slots));
  return a;
}

std::optional<Allocation> AllocationTable::find(std::uintptr_t ptr) const {
  const std::uint64_t h = hash(ptr);
  const Shard& s = shards_[h >> 58];
  std::lock_guard<SpinLock> guard(s.lock);
  const Slot* slot = slot_of(s, ptr, h);
  if (slot == nullptr) return std::nullopt;
  return slot->value;
}

std::optional<Allocation> AllocationTable::add_flags(std::uintptr_t ptr, std::uint32_t flags) {
  const std::uint64_t h = hash(ptr);
  Shard& s = shard_for(shards_, h);
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
