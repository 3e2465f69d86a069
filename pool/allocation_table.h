// The table of live pooled allocations: device pointer -> what we know about it. Sharded by
// the pointer's 2 MiB granule with one small lock per shard, so that no lock is process-wide
// and a thread's allocations, which come from its own arena's segments (DESIGN §7), mostly
// land on shards no other thread touches: a pair then finds the shard's lock and slots in its
// own CPU's cache. Slots live in mmap'd memory that grows by doubling under the shard lock:
// steady-state inserts and removals never allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

#include "spin_lock.h"

namespace poolshim {

struct Allocation {
  std::uint64_t requested = 0;  // bytes the application asked for
  std::uint64_t capacity = 0;   // bytes of the pool block serving it (>= requested)
  std::uint64_t birth_ns = 0;   // coarse monotonic time of the allocation
  std::uintptr_t stream = 0;    // the stream of a cudaMallocAsync; 0 for cudaMalloc
  std::int32_t device = -1;
  std::uint32_t flags = 0;
  std::uint32_t site = 0;  // call site id (POOLSHIM_BACKTRACE), 0 when not recorded
  std::int32_t arena = 0;  // the heap's arena that holds the block (DeviceHeap)
  void* block = nullptr;   // the heap's handle of the block (SegmentAllocator::Block::node)

  static constexpr std::uint32_t kAsync = 1;
  static constexpr std::uint32_t kExported = 2;  // exported through legacy IPC (ipc_share.h)
  static constexpr std::uint32_t kNative = 4;    // the real function's (router.h: natives_)
};

class AllocationTable {
 public:
  static constexpr int kShards = 1024;

  AllocationTable();
  ~AllocationTable();
  AllocationTable(const AllocationTable&) = delete;
  AllocationTable& operator=(const AllocationTable&) = delete;

  /// Records a live allocation. `ptr` must not be 0 and must not be present.
  void insert(std::uintptr_t ptr, const Allocation& a);
  /// Removes and returns the record of `ptr`, or nullopt when the pool did not hand it out.
  std::optional<Allocation> take(std::uintptr_t ptr);
  /// The record of `ptr` without removing it.
  std::optional<Allocation> find(std::uintptr_t ptr) const;
  /// ORs `flags` into the record of `ptr` and returns it, or nullopt when there is none.
  std::optional<Allocation> add_flags(std::uintptr_t ptr, std::uint32_t flags);
  /// Removes every record of `device`, calling `dropped` for each (under its shard's lock).
  void drop_device(int device,
                   const std::function<void(std::uintptr_t, const Allocation&)>& dropped);
  /// Calls `visit` for every record, one shard locked at a time.
  void for_each(const std::function<void(std::uintptr_t, const Allocation&)>& visit) const;
  std::size_t size() const;
  /// The shard of `ptr`: its 2 MiB granule's (the granule number's bits folded to 10).
  static std::size_t shard_index(std::uintptr_t ptr);

 private:
  struct Slot {
    std::uintptr_t key;  // 0 = empty
    Allocation value;
  };
  struct alignas(64) Shard {
    mutable SpinLock lock;
    Slot* slots = nullptr;
    std::size_t capacity = 0;  // power of two
    std::size_t count = 0;
  };

  static std::uint64_t hash(std::uintptr_t ptr);
  Shard& shard_of(std::uintptr_t ptr) { return shards_[shard_index(ptr)]; }
  const Shard& shard_of(std::uintptr_t ptr) const { return shards_[shard_index(ptr)]; }
  static void grow(Shard& s);
  static void insert_unlocked(Shard& s, std::uintptr_t key, const Allocation& value,
                              std::uint64_t h);
  static void erase_at(Shard& s, std::size_t index);
  /// The slot of `key` (hash `h`) in `s`, under its lock; null when it holds none.
  static Slot* slot_of(const Shard& s, std::uintptr_t key, std::uint64_t h);

  Shard shards_[kShards];
  Slot* initial_ = nullptr;  // every shard's first slots, one mapping
};

}  // namespace poolshim
