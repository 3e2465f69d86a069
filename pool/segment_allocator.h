// SegmentAllocator: one device's user-space allocator over its cudaMemPool (issue 13). It takes
// large segments from the pool and serves requests by splitting them; a free merges the block
// with its free neighbours; whole free segments go back to the pool (release threshold, idle
// trim, out-of-memory). Unlike the whole-block cache it replaces, memory freed at one size
// serves any other size, so a program whose sizes change from step to step does not leave a
// "menu" of blocks behind.
//
// Layout (after PyTorch's CUDACachingAllocator, with TLSF's bins for the search):
// - sizes are rounded up to 512 bytes;
// - requests of at most 1 MiB come from 2 MiB "small" segments, larger ones from 20 MiB
//   segments, requests over 10 MiB from a segment of their own size rounded to 2 MiB; the two
//   arenas never share segments, so that small, short-lived blocks do not pin large segments;
// - free blocks sit in bins of eight per power of two (TLSF's two-level index, one bitmap), so
//   that a search is a few bit operations and a short list walk: the smallest fitting block of
//   the request's own bin, else the first usable block of the next non-empty bins;
// - a block is split when the remainder is at least 512 bytes (small arena) or 1 MiB (large
//   arena: smaller remainders of large blocks would only fragment it);
// - block and segment descriptors come from mmap'd slabs and are recycled: in steady state
//   (splits and merges balance) nothing is allocated.
//
// Stream order (DESIGN §3): a free block remembers the stream token it was freed for
// (`affinity`: work queued on that stream is ordered before any new use on it) and the fence
// after which every stream may use it (`ready_at`). It serves a request at once for the same
// token, or for any token once its fence has completed. Merged blocks keep a token only when
// both parts had it, and the later fence. Which token a free carries is the Router's policy
// (the legacy default stream orders every blocking stream, for instance); the allocator only
// compares them.
//
// Thread safety: every call takes the allocator's one spin lock for the bookkeeping only; the
// segment source (driver calls) is called outside it.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "spin_lock.h"

namespace poolshim {

/// Where segments come from and go back to: the device's cudaMemPool (DevicePoolSegments), or a
/// test's stand-in.
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  /// `bytes` of device memory usable from every stream once this returns; false when the pool
  /// cannot provide them (out of memory, cap).
  virtual bool reserve(std::uint64_t bytes, CUdeviceptr* out) = 0;
  /// Gives back a segment whose every use has completed.
  virtual void release(CUdeviceptr base, std::uint64_t bytes) = 0;
};

class SegmentAllocator {
 public:
  static constexpr std::uint64_t kGranule = 512;
  static constexpr std::uint64_t kSmallRequest = 1ULL << 20;  // at most this: small arena
  static constexpr std::uint64_t kSmallSegment = 2ULL << 20;
  static constexpr std::uint64_t kLargeSegment = 20ULL << 20;
  static constexpr std::uint64_t kOwnSegment = 10ULL << 20;  // above this: a segment of its own
  static constexpr std::uint64_t kSegmentRounding = 2ULL << 20;
  static constexpr std::uint64_t kLargeSplitMin = 1ULL << 20;  // smallest remainder split off
  static constexpr int kSearchBudget = 64;  // usable-block checks in one search at the most

  /// A block handed out: its address, its size after rounding, and the allocator's handle of
  /// it (for free).
  struct Block {
    CUdeviceptr ptr = 0;
    std::uint64_t size = 0;
    void* node = nullptr;
  };

  struct Stats {
    std::uint64_t reserved = 0;   // bytes of segments held from the source
    std::uint64_t allocated = 0;  // bytes of blocks handed out
    std::uint64_t segments = 0;
    std::uint64_t free_blocks = 0;
    std::uint64_t largest_free = 0;  // the largest free block, usable or not
    std::uint64_t reserved_peak = 0;
    std::uint64_t allocated_peak = 0;
    std::uint64_t splits = 0;  // running totals
    std::uint64_t merges = 0;
    std::uint64_t segments_reserved = 0;
    std::uint64_t segments_released = 0;
  };

  explicit SegmentAllocator(SegmentSource& source);
  ~SegmentAllocator();
  SegmentAllocator(const SegmentAllocator&) = delete;
  SegmentAllocator& operator=(const SegmentAllocator&) = delete;

  /// `bytes` rounded to the granule (what a block of the request holds).
  static std::uint64_t rounded(std::uint64_t bytes);
  /// The segment a request of `bytes` that finds no free block makes the allocator reserve.
  static std::uint64_t segment_for(std::uint64_t bytes);

  /// Serves `bytes` (> 0) for stream token `affinity` (0: no stream's order may be relied on),
  /// when fences up to `completed` have completed: from a free block, else from a new segment.
  /// False (nothing changed) when none fits and the source cannot reserve a segment.
  bool allocate(std::uint64_t bytes, std::uintptr_t affinity, std::uint64_t completed, Block* out);
  /// Serves `bytes` from a free block only (no new segment): false when none is usable.
  bool allocate_from_free(std::uint64_t bytes, std::uintptr_t affinity, std::uint64_t completed,
                          Block* out);
  /// Takes back a block allocate() handed out: usable at once for `affinity` (0: none), and for
  /// every stream once fence `ready_at` has completed (0: at once).
  void free(const Block& block, std::uintptr_t affinity, std::uint64_t ready_at);
  /// Gives back whole free segments whose fence has completed (largest first) until at most
  /// `keep` bytes are reserved. Returns the bytes given back.
  std::uint64_t trim(std::uint64_t keep, std::uint64_t completed);
  /// A stream token is about to stop meaning its stream (the stream is destroyed): free blocks
  /// lose its shortcut and wait for their fence like any other.
  void forget_affinity(std::uintptr_t affinity);
  /// Forgets every segment without giving it back (the device was reset: the pool is gone).
  void clear();

  Stats stats() const;

 private:
  struct Node;
  struct Segment;
  struct Arena;
  struct Slabs;

  Node* search(Arena& arena, std::uint64_t size, std::uintptr_t affinity, std::uint64_t completed);
  Node* carve(Arena& arena, Node* node, std::uint64_t size);
  /// The new segment's one free node; nullptr (and the segment given back) without descriptors.
  Node* add_segment(Arena& arena, CUdeviceptr base, std::uint64_t bytes);
  Arena& arena_for(std::uint64_t size);
  void insert_free(Arena& arena, Node* node);
  void remove_free(Arena& arena, Node* node);
  void note_allocated(std::uint64_t size);

  SegmentSource& source_;
  mutable SpinLock lock_;
  Arena* small_;
  Arena* large_;
  Slabs* slabs_;
  Stats stats_;
};

}  // namespace poolshim
