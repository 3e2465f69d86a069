// BlockCache: recently freed blocks of one device, kept in user space in front of its
// cudaMemPool so that a reuse never enters the driver (issue 6: the driver pool's own lock is
// the floor of cudaMallocFromPoolAsync, and it does not scale across threads).
//
// A block stays allocated from the driver pool while it is cached: to the driver it is still
// in use, to the application it is free (cudaMemGetInfo counts it so). Reuse is exactly as safe
// as the driver's (DESIGN §3):
// - a block freed in a stream's order (cudaFreeAsync on stream s) serves a later allocation on
//   s at once: the stream orders the new use behind the old one;
// - any other use waits for a *fence*: a device-wide point after the free (a synchronization
//   of the device, or an event recorded behind every stream of the device) that has completed.
//   Fences are numbered; a block remembers the number of the first fence issued after its free
//   (`ready_at`), and is ready for any stream once every fence up to that number is complete.
//
// The cache is a table of size classes (four per power of two), each a short array under its own
// spin lock: no process-wide lock, no allocation after construction. It is bounded in bytes; a
// block that does not fit is given back to the pool by the caller.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>

#include "atomic_max.h"
#include "spin_lock.h"

namespace poolshim {

struct CachedBlock {
  CUdeviceptr ptr = 0;
  std::uint64_t capacity = 0;  // bytes allocated from the pool for it
  CUstream stream = nullptr;   // usable at once on this stream; nullptr: only when ready
  std::uint64_t ready_at = 0;  // the fence after which any stream may use it
  std::uint64_t freed_ns = 0;  // coarse time of the free (aging)
};

/// The affinity of a block freed by cudaFree (mode ordered) while its device had no non-blocking
/// stream: it may serve an allocation once a barrier is recorded on the legacy default stream
/// after its free (Router::legacy_barrier; the legacy_reuse option). Not a stream handle: it is
/// never given to the driver.
inline const CUstream kBehindLegacyBarrier = reinterpret_cast<CUstream>(std::uintptr_t{3});

/// The fence counters of one device (see above).
class FenceClock {
 public:
  /// Number of the fence being started now: every free before this call is covered by it.
  std::uint64_t start() { return issued_.fetch_add(1, std::memory_order_acq_rel) + 1; }
  /// Fence `k` has completed (and with it every earlier one: a later fence covers all work
  /// an earlier one covers).
  void complete(std::uint64_t k) { raise_to(completed_, k, std::memory_order_release); }
  /// The fence that will cover a free made now: the next one to start.
  std::uint64_t next() const { return issued_.load(std::memory_order_acquire) + 1; }
  std::uint64_t completed() const { return completed_.load(std::memory_order_acquire); }
  std::uint64_t issued() const { return issued_.load(std::memory_order_acquire); }

 private:
  std::atomic<std::uint64_t> issued_{0};
  std::atomic<std::uint64_t> completed_{0};
};

class BlockCache {
 public:
  static constexpr int kClassesPerOctave = 4;
  static constexpr int kClasses = 48 * kClassesPerOctave;
  static constexpr int kSlots = 48;  // blocks per class

  /// A cache that holds at most `limit` bytes (0: the cache is off, every put fails).
  explicit BlockCache(std::uint64_t limit);
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  /// Class of a block of `capacity` bytes (> 0): four classes per power of two.
  static int class_of(std::uint64_t capacity);
  /// Largest block that may serve a request of `bytes`: a quarter more, so that reuse never
  /// wastes more than 20% of a block.
  static std::uint64_t largest_fit(std::uint64_t bytes) { return bytes + bytes / 4; }

  /// Takes the most recently freed block that fits `bytes` and may be used on `stream` now:
  /// one whose fence has completed (`completed`), or one freed in `stream`'s order (`stream`
  /// non-null). nullopt-like false when none.
  bool take(std::uint64_t bytes, CUstream stream, std::uint64_t completed, CachedBlock* out);
  /// Keeps `block`. False (nothing kept) when the cache is off, over its byte limit, or the
  /// block's class is full of blocks that are not ready; when the class is full and its oldest
  /// block is ready, that block is handed back in *evicted and `block` takes its place.
  bool put(const CachedBlock& block, std::uint64_t completed, CachedBlock* evicted);
  /// Removes every block for which `pred(block)` holds (called under its class's lock) and
  /// then hands it to `sink(block)`. Returns the bytes removed.
  template <typename Pred, typename Sink>
  std::uint64_t remove_if(Pred&& pred, Sink&& sink);
  /// Forgets every block without handing it anywhere (the device was reset: they are gone).
  void clear();
  /// For the pool to reuse: the smallest ready block of at least `bytes` (any size above), or
  /// when there is none, the largest ready block. False when no block is ready.
  bool take_for_pool(std::uint64_t bytes, std::uint64_t completed, CachedBlock* out);
  /// Takes the block at `ptr` whatever its state (a free of a pointer that is cached is a
  /// double free: the block must leave the cache before the real function sees it).
  bool take_pointer(CUdeviceptr ptr, CachedBlock* out);
  /// A stream is about to be destroyed: its blocks lose their stream-order shortcut and wait
  /// for a fence like any other (their `ready_at` already covers their free).
  void forget_stream(CUstream stream);

  std::uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  std::uint64_t peak_bytes() const { return peak_bytes_.load(std::memory_order_relaxed); }
  std::uint64_t limit() const { return limit_; }
  /// Whether a block kept may still wait for a fence later than `completed` (one is worth
  /// starting).
  bool waiting(std::uint64_t completed) const {
    return newest_ready_at_.load(std::memory_order_relaxed) > completed;
  }

 private:
  struct alignas(64) Class {
    SpinLock lock;
    std::uint32_t count = 0;  // slots[0..count): oldest first
    CachedBlock slots[kSlots];
  };
  static void erase(Class& c, std::uint32_t i);
  /// Keeps the peak and the newest fence; `now` is the byte count with `b` in it.
  void note_added(const CachedBlock& b, std::uint64_t now);

  const std::uint64_t limit_;
  std::unique_ptr<Class[]> classes_;
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> peak_bytes_{0};
  std::atomic<std::uint64_t> newest_ready_at_{0};  // the largest ready_at ever kept
};

template <typename Pred, typename Sink>
std::uint64_t BlockCache::remove_if(Pred&& pred, Sink&& sink) {
  if (!classes_) return 0;
  std::uint64_t removed = 0;
  CachedBlock taken[kSlots];
  for (int k = 0; k < kClasses; ++k) {
    Class& c = classes_[k];
    std::uint32_t n = 0;
    c.lock.lock();
    for (std::uint32_t i = 0; i < c.count;) {
      if (pred(static_cast<const CachedBlock&>(c.slots[i]))) {
        taken[n++] = c.slots[i];
        erase(c, i);
      } else {
        ++i;
      }
    }
    c.lock.unlock();
    // Handed out after the lock is dropped: `sink` may make driver calls.
    for (std::uint32_t i = 0; i < n; ++i) {
      removed += taken[i].capacity;
      bytes_.fetch_sub(taken[i].capacity, std::memory_order_relaxed);
      sink(static_cast<const CachedBlock&>(taken[i]));
    }
  }
  return removed;
}

}  // namespace poolshim
