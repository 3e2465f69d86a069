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
//   the request's own bin, else the first usable block of the next non-empty bins (in the
//   page map's range, a free block whose pages are mapped first, DESIGN §7);
// - a block is split when the remainder is at least 512 bytes (small arena) or 1 MiB (large
//   arena: smaller remainders of large blocks would only fragment it);
// - block and segment descriptors come from mmap'd slabs and are recycled: in steady state
//   (splits and merges balance) nothing is allocated.
//
// Stream order (DESIGN §3): a free block remembers the stream token it was freed for
// (`affinity`: work queued on that stream is ordered before any new use on it) and the fence
// after which every stream may use it (`ready_at`). It serves a request at once for the same
// token, or for any token once its fence has completed. A new segment's free rest carries the
// token of the request that made it (it is ready for every stream too), so that a stream's frees
// merge with the rest of its own segments, as PyTorch's per-stream segments do. Free neighbours
// merge when they have the same token (the later fence), or when both are ready; others wait,
// apart, for coalesce(). Which token a free carries is the Router's policy
// (the legacy default stream orders every blocking stream, for instance); the allocator only
// compares them.
//
// Paged large arena (DESIGN §7, page_map.h): given a PageMap, requests over 1 MiB are placed in
// its one range of reserved addresses (one segment as large as the range: free blocks merge
// across the whole of it) and only the pages under them are backed. A free block serves a
// request from the free list when its pages are mapped; otherwise the request maps the missing
// pages, first claiming pages of free, ready blocks when the arena's mapped bytes would exceed
// its live large bytes plus `slack`. trim() unmaps such pages too (trim(0): all of them, for
// the retry after an out-of-memory answer). When the range cannot be reserved or is full, the
// arena's segments come from the source as without it.
//
// Thread safety: every call takes the allocator's one spin lock for the bookkeeping only; the
// segment source and the page map (driver calls) are called outside it.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "spin_lock.h"

namespace poolshim {

class PageMap;
class SharedSlack;

/// Where segments come from and go back to: the device's cudaMemPool (DevicePoolSegments), or a
/// test's stand-in.
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  /// `bytes` of device memory usable from every stream once this returns; false when the pool
  /// cannot provide them (out of memory, cap; `why` then holds the driver's answer).
  virtual bool reserve(std::uint64_t bytes, CUdeviceptr* out, CUresult* why) = 0;
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

  /// A block handed out: its address, its size after rounding, the allocator's handle of it
  /// (for free), and the fence it waited for when it was free (0: a new segment's). A block
  /// whose `ready_at` has not completed was served by its stream token.
  struct Block {
    CUdeviceptr ptr = 0;
    std::uint64_t size = 0;
    void* node = nullptr;
    std::uint64_t ready_at = 0;
  };

  struct Stats {
    std::uint64_t reserved = 0;   // bytes of segments held from the source
    std::uint64_t allocated = 0;  // bytes of blocks handed out
    std::uint64_t segments = 0;
    std::uint64_t free_blocks = 0;
    std::uint64_t largest_free = 0;  // the largest free block, usable or not
    std::uint64_t free_peak = 0;     // the most bytes held in free blocks at once
    std::uint64_t reserved_peak = 0;
    std::uint64_t allocated_peak = 0;
    std::uint64_t splits = 0;  // running totals
    std::uint64_t merges = 0;
    std::uint64_t segments_reserved = 0;
    std::uint64_t segments_released = 0;
  };

  /// `pages` (may be null): the paged large arena's page map; `slack`: the mapped bytes it may
  /// hold beyond its blocks in use before it claims free pages.
  explicit SegmentAllocator(SegmentSource& source, PageMap* pages = nullptr,
                            std::uint64_t slack = 0);
  ~SegmentAllocator();
  SegmentAllocator(const SegmentAllocator&) = delete;
  /// From now on the paged arena's slack is its allowance in `share` (shared_slack.h) instead of
  /// `slack`. Before any request.
  void share_slack(const SharedSlack* share, int member) {
    share_ = share;
    share_member_ = member;
  }
  SegmentAllocator& operator=(const SegmentAllocator&) = delete;

  /// `bytes` rounded to the granule (what a block of the request holds).
  static std::uint64_t rounded(std::uint64_t bytes);
  /// The segment a request of `bytes` that finds no free block makes the allocator reserve.
  static std::uint64_t segment_for(std::uint64_t bytes);

  /// Serves `bytes` (> 0) for stream token `affinity` (0: no stream's order may be relied on),
  /// when fences up to `completed` have completed: from a free block, else from a new segment
  /// (of segment_for(bytes); when the source is out of memory for it, of the request's own size
  /// rounded to 2 MiB).
  /// False (nothing changed) when none fits and the source cannot reserve a segment (`why`, when
  /// given, then holds the source's answer).
  bool allocate(std::uint64_t bytes, std::uintptr_t affinity, std::uint64_t completed, Block* out,
                CUresult* why = nullptr);
  /// Serves `bytes` from a free block only (no new segment): false when none is usable.
  bool allocate_from_free(std::uint64_t bytes, std::uintptr_t affinity, std::uint64_t completed,
                          Block* out);
  /// Takes back a block allocate() handed out: usable at once for `affinity` (0: none), and for
  /// every stream once fence `ready_at` has completed (0: at once). It merges with a free
  /// neighbour of the same token, or with one when both are ready (fences up to `completed`
  /// have completed), so that a freshly freed block never makes ready memory wait.
  void free(const Block& block, std::uintptr_t affinity, std::uint64_t ready_at,
            std::uint64_t completed = 0);
  /// Merges free neighbours left apart at their free (different tokens) that have since become
  /// mergeable (both ready at `completed`). Walks every block: for a miss that would otherwise
  /// grow, and the background. Returns the merges made.
  std::uint64_t coalesce(std::uint64_t completed);
  /// Gives back whole free segments whose fence has completed (largest first) until at most
  /// `keep` bytes are reserved. Returns the bytes given back.
  std::uint64_t trim(std::uint64_t keep, std::uint64_t completed);
  /// A stream token is about to stop meaning its stream (the stream is destroyed): free blocks
  /// lose its shortcut and wait for their fence like any other.
  void forget_affinity(std::uintptr_t affinity);
  /// Forgets every segment without giving it back (the device was reset: the pool is gone).
  void clear();

  Stats stats() const;
  /// Bytes held in free blocks (reserved but not handed out), without the lock.
  std::uint64_t free_bytes() const { return free_bytes_.load(std::memory_order_relaxed); }
  std::uint64_t free_peak() const { return free_peak_.load(std::memory_order_relaxed); }
  std::uint64_t allocated_bytes() const { return allocated_.load(std::memory_order_relaxed); }
  /// Mapped bytes of the paged range beyond its blocks in use (0 without a page map), lock-free.
  std::uint64_t paged_excess() const;
  /// Whether a free block may still wait for a fence later than `completed` (one is worth
  /// starting), without the lock.
  bool waiting(std::uint64_t completed) const {
    return newest_ready_at_.load(std::memory_order_relaxed) > completed;
  }

 private:
  struct Node;
  struct Segment;
  struct Arena;
  struct Slabs;

  /// The paged arena's part of allocate(): 1 served, 0 failed (`why`), -1 not paged (the
  /// range cannot be reserved or has no room): segments from the source serve it.
  int allocate_paged(std::uint64_t size, std::uintptr_t affinity, std::uint64_t completed,
                     Block* out, CUresult* why);
  /// Maps the pages under a carved block (under the page map's mutex).
  CUresult back(const Node* node, std::uint64_t completed);
  /// Claims and unmaps up to `want` bytes of pages wholly inside free blocks of the range that
  /// are ready at `completed`, highest first. Under the page map's mutex; takes the lock.
  std::uint64_t harvest(std::uint64_t want, std::uint64_t completed);
  std::uint64_t reserved_now() const;  // segments plus held pages (under the lock)
  /// Best fit in the request's bin, else the first usable block of a later bin; with
  /// `mapped_only`, a block of the page map's range only when its pages under `size` are mapped.
  Node* search(Arena& arena, std::uint64_t size, std::uintptr_t affinity, std::uint64_t completed,
               bool mapped_only = false);
  Node* carve(Arena& arena, Node* node, std::uint64_t size);
  /// The new segment's one free node; nullptr (and the segment given back) without descriptors.
  Node* add_segment(Arena& arena, CUdeviceptr base, std::uint64_t bytes, std::uintptr_t affinity,
                    bool paged = false);
  static bool mergeable(const Node* a, const Node* b, std::uint64_t completed);
  void absorb(Node* into, Node* gone);
  void merge_neighbours(Arena& arena, Node*& node, std::uint64_t completed);
  Arena& arena_for(std::uint64_t size);
  void insert_free(Arena& arena, Node* node);
  void remove_free(Arena& arena, Node* node);
  void note_allocated(std::uint64_t size);
  void publish();  // the lock-free figures, from stats_ (under the lock)

  SegmentSource& source_;
  PageMap* const pages_;
  const std::uint64_t slack_;
  const SharedSlack* share_ = nullptr;  // when set, the slack is its allowance
  int share_member_ = -1;
  Segment* paged_ = nullptr;                       // the page map's range, once added
  std::atomic<std::uint64_t> paged_allocated_{0};  // bytes of blocks handed out from it
  mutable SpinLock lock_;
  Arena* small_;
  Arena* large_;
  Slabs* slabs_;
  Stats stats_;
  std::atomic<std::uint64_t> free_bytes_{0};
  std::atomic<std::uint64_t> free_peak_{0};
  std::atomic<std::uint64_t> allocated_{0};
  std::atomic<std::uint64_t> newest_ready_at_{0};
};

}  // namespace poolshim
