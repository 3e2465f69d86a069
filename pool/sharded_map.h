// A hash map from 64-bit keys to small trivially copyable values for tables that hooks on many
// threads change: sharded by key hash with one small lock per shard (no process-wide lock),
// slots in mmap'd memory that doubles under the shard lock, so that steady-state inserts and
// removals never allocate. The same layout as AllocationTable (linear probing, backward-shift
// deletion), but every key is usable (0 included: a CUmemGenericAllocationHandle is opaque) and
// callers edit an entry in place under its lock through a template callable, never
// std::function (which may allocate).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <type_traits>

#include "spin_lock.h"

namespace poolshim {

template <typename Value>
class ShardedMap {
  // Slots are zero-filled mmap'd memory, copied and moved bytewise.
  static_assert(std::is_trivially_copyable_v<Value>, "ShardedMap values are copied bytewise");

 public:
  static constexpr int kShards = 64;

  /// `initial_capacity` slots a shard (a power of two); a shard doubles when half full.
  explicit ShardedMap(std::size_t initial_capacity = 256) {
    for (Shard& s : shards_) {
      s.capacity = initial_capacity;
      s.slots = map_slots(s.capacity);
    }
  }
  ~ShardedMap() {
    for (Shard& s : shards_) munmap(s.slots, s.capacity * sizeof(Slot));
  }
  ShardedMap(const ShardedMap&) = delete;
  ShardedMap& operator=(const ShardedMap&) = delete;

  /// Calls `edit(Value& value, bool inserted)` under the shard lock of `key` on its entry, a new
  /// value-initialized one (`inserted` true) when there was none.
  template <typename Edit>
  void upsert(std::uint64_t key, Edit&& edit) {
    const std::uint64_t h = hash(key);
    Shard& s = shard_for(h);
    std::lock_guard<SpinLock> guard(s.lock);
    if (Slot* slot = slot_of(s, key, h)) {
      edit(slot->value, false);
      return;
    }
    if ((s.count + 1) * 2 > s.capacity) grow(s);  // keep the load under one half
    Slot& slot = insert_unlocked(s, key, Value{}, h);
    edit(slot.value, true);
  }

  /// When `key` is present, calls `edit(Value& value)` under its shard lock and erases the
  /// entry when `edit` returns false. Returns whether `key` was present.
  template <typename Edit>
  bool update(std::uint64_t key, Edit&& edit) {
    const std::uint64_t h = hash(key);
    Shard& s = shard_for(h);
    std::lock_guard<SpinLock> guard(s.lock);
    Slot* slot = slot_of(s, key, h);
    if (slot == nullptr) return false;
    if (!edit(slot->value)) erase_at(s, static_cast<std::size_t>(slot - s.slots));
    return true;
  }

  /// Removes and returns the entry of `key`, or nullopt when there is none.
  std::optional<Value> take(std::uint64_t key) {
    std::optional<Value> taken;
    update(key, [&](Value& v) {
      taken = v;
      return false;
    });
    return taken;
  }

  /// The entry of `key` without removing it.
  std::optional<Value> find(std::uint64_t key) const {
    const std::uint64_t h = hash(key);
    const Shard& s = shards_[h >> 58];
    std::lock_guard<SpinLock> guard(s.lock);
    const Slot* slot = slot_of(s, key, h);
    if (slot == nullptr) return std::nullopt;
    return slot->value;
  }

  /// Erases every entry for which `erase(std::uint64_t key, const Value& value)` returns true,
  /// one shard locked at a time; `erase` runs under that lock and may note what it erases.
  /// Returns how many were erased.
  template <typename Predicate>
  std::size_t erase_if(Predicate&& erase) {
    std::size_t erased = 0;
    for (Shard& s : shards_) {
      std::lock_guard<SpinLock> guard(s.lock);
      // Backward shifts move later slots into earlier ones: look at slot i again after an erase.
      for (std::size_t i = 0; i < s.capacity;) {
        if (s.slots[i].used && erase(s.slots[i].key, static_cast<const Value&>(s.slots[i].value))) {
          erase_at(s, i);
          ++erased;
          continue;
        }
        ++i;
      }
    }
    return erased;
  }

  /// Calls `visit(std::uint64_t key, const Value& value)` for every entry, one shard locked at
  /// a time (so `visit` should not allocate: hooks may be waiting for the lock).
  template <typename Visit>
  void for_each(Visit&& visit) const {
    for (const Shard& s : shards_) {
      std::lock_guard<SpinLock> guard(s.lock);
      for (std::size_t i = 0; i < s.capacity; ++i) {
        if (s.slots[i].used) visit(s.slots[i].key, s.slots[i].value);
      }
    }
  }

  std::size_t size() const {
    std::size_t n = 0;
    for (const Shard& s : shards_) {
      std::lock_guard<SpinLock> guard(s.lock);
      n += s.count;
    }
    return n;
  }

 private:
  struct Slot {
    std::uint64_t key;
    bool used;  // a separate flag rather than a reserved key: every key value may occur
    Value value;
  };
  struct alignas(64) Shard {
    mutable SpinLock lock;
    Slot* slots = nullptr;
    std::size_t capacity = 0;  // power of two
    std::size_t count = 0;
  };

  static Slot* map_slots(std::size_t count) {
    void* p = mmap(nullptr, count * sizeof(Slot), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();  // out of host address space: nothing sane is left to do
    return static_cast<Slot*>(p);       // zero-filled: every slot unused
  }

  // A full 64-bit mix (murmur3's finalizer): VMM addresses are 2 MiB-aligned and handles are
  // pointer-like, so the low bits alone say little. Top 6 bits pick the shard, low bits the slot.
  static std::uint64_t hash(std::uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
  }
  static_assert(kShards == 64, "shard_for takes the top 6 bits of the hash");
  Shard& shard_for(std::uint64_t h) { return shards_[h >> 58]; }

  static Slot& insert_unlocked(Shard& s, std::uint64_t key, const Value& value, std::uint64_t h) {
    const std::size_t mask = s.capacity - 1;
    std::size_t i = h & mask;
    while (s.slots[i].used) i = (i + 1) & mask;
    s.slots[i].key = key;
    s.slots[i].used = true;
    s.slots[i].value = value;
    ++s.count;
    return s.slots[i];
  }

  static void grow(Shard& s) {
    Slot* old = s.slots;
    const std::size_t old_capacity = s.capacity;
    s.capacity = old_capacity * 2;
    s.slots = map_slots(s.capacity);
    s.count = 0;
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i].used) insert_unlocked(s, old[i].key, old[i].value, hash(old[i].key));
    }
    munmap(old, old_capacity * sizeof(Slot));
  }

  // Backward-shift deletion keeps linear probing free of tombstones.
  static void erase_at(Shard& s, std::size_t index) {
    const std::size_t mask = s.capacity - 1;
    std::size_t hole = index;
    std::size_t i = (index + 1) & mask;
    while (s.slots[i].used) {
      const std::size_t home = hash(s.slots[i].key) & mask;
      // Move slot i into the hole unless its home lies cyclically in (hole, i].
      const bool home_after_hole = ((i - home) & mask) < ((i - hole) & mask);
      if (!home_after_hole) {
        s.slots[hole] = s.slots[i];
        hole = i;
      }
      i = (i + 1) & mask;
    }
    s.slots[hole].used = false;
    --s.count;
  }

  /// The slot of `key` (hash `h`) in `s`, under its lock; null when it holds none.
  static Slot* slot_of(const Shard& s, std::uint64_t key, std::uint64_t h) {
    const std::size_t mask = s.capacity - 1;
    for (std::size_t i = h & mask; s.slots[i].used; i = (i + 1) & mask) {
      if (s.slots[i].key == key) return &s.slots[i];
    }
    return nullptr;
  }

  Shard shards_[kShards];
};

}  // namespace poolshim
