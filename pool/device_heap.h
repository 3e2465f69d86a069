// DeviceHeap: a device's heap as the Router uses it (DESIGN §7): several SegmentAllocators
// ("arenas") over the one pool, so that threads allocating on their own streams do not meet on
// one lock. cudaMalloc's requests and the legacy stream's share arena 0 (one program's main
// allocations stay together, whatever thread makes them: PyTorch's autograd thread, say); a
// request on a named stream goes to its thread's arena (arena_claims.h: a thread claims one of
// arenas 1-15 and gives it back at exit). It takes a usable free block there, else one of an
// arena no other live thread holds (arena 0, the thread's own, an exited thread's), and only
// then grows its own arena by a segment. Free memory of arenas other live threads hold is
// borrowed only when asked: from arenas idle for a period (Lend::idle, arena_activity.h: the
// Router's bounded-memory rule), or from any (Lend::any: out of memory), so that in steady
// state a thread locks only its own arena. A block goes back to the arena it came from,
// whatever thread or stream frees it.
#pragma once

#include <cuda.h>

#include <array>
#include <cstdint>
#include <memory>

#include "arena_activity.h"
#include "arena_claims.h"
#include "page_map.h"
#include "segment_allocator.h"
#include "shared_slack.h"

namespace poolshim {

class DeviceHeap {
 public:
  static constexpr int kArenas = kHeapArenas;

  /// Which other arenas' free memory a request may take: those no other live thread holds;
  /// those too whose live threads made no request for a period (ArenaActivity); or any.
  enum class Lend { unheld, idle, any };

  /// A block handed out, with the arena that holds it.
  struct Block {
    CUdeviceptr ptr = 0;
    std::uint64_t size = 0;
    void* node = nullptr;
    std::uint64_t ready_at = 0;  // see SegmentAllocator::Block
    int arena = 0;
  };

  /// The paged large arenas (page_map.h): with `physical`, each arena places its requests over
  /// 1 MiB in a range of `span` addresses backed by pages of `page` bytes; together they hold
  /// at most `slack` mapped bytes beyond their blocks before a request claims free pages of its
  /// arena (shared_slack.h).
  struct Paging {
    PhysicalMemory* physical = nullptr;  // null: large blocks from segments of the source
    std::uint64_t page = 0;
    std::uint64_t span = 0;
    std::uint64_t slack = 0;
  };

  DeviceHeap(SegmentSource& source, const Paging& paging);
  explicit DeviceHeap(SegmentSource& source) : DeviceHeap(source, Paging{}) {}

  /// The arena of a request for stream token `token` on this thread (0 and the legacy
  /// stream's: arena 0; a named stream's: the thread's own, claimed at its first).
  static int arena_for(std::uintptr_t token);

  /// A usable free block for `token` (`completed` fences done): its own arena's first, then
  /// those of the other arenas that `lend` allows. False when none.
  bool allocate_from_free(std::uint64_t bytes, std::uintptr_t token, std::uint64_t completed,
                          Block* out, Lend lend = Lend::unheld);
  /// Grows `token`'s arena by a segment for the request (SegmentAllocator::allocate).
  bool allocate(std::uint64_t bytes, std::uintptr_t token, std::uint64_t completed, Block* out,
                CUresult* why);
  /// Takes back a block into the arena that handed it out (SegmentAllocator::free).
  void free(int arena, void* node, std::uint64_t size, std::uintptr_t token, std::uint64_t ready_at,
            std::uint64_t completed);
  /// Gives back whole free segments whose fence has completed, arena after arena, until at most
  /// `keep` bytes are reserved in all. Returns the bytes given back.
  std::uint64_t trim(std::uint64_t keep, std::uint64_t completed);
  /// SegmentAllocator::coalesce over the arenas holding free memory that `lend` lets a request
  /// for `token` take.
  std::uint64_t coalesce(std::uint64_t completed, std::uintptr_t token, Lend lend);
  /// Free bytes, and whether blocks wait for a fence, in the arenas that `lend` lets a request
  /// for `token` take (lock-free).
  std::uint64_t free_bytes(std::uintptr_t token, Lend lend) const;
  bool waiting(std::uint64_t completed, std::uintptr_t token, Lend lend) const;
  /// The background worker's tick: ArenaActivity::tick.
  void tick(std::uint64_t now_ns) { activity_.tick(now_ns); }
  void forget_affinity(std::uintptr_t token);
  void clear();
  /// Unmaps and destroys every page of the paged arenas and gives their addresses back (the
  /// device is about to be reset or the process to end; after clear()).
  void release_pages();
  /// The page map whose range holds `p` (a block of a paged arena), else null.
  const PageMap* pages_of(CUdeviceptr p) const;
  /// Whether large blocks come from paged arenas.
  bool paged() const { return pages_[0] != nullptr; }
  /// Physical bytes the page maps hold, and (`peak`, when given) the sum of their peaks,
  /// lock-free.
  std::uint64_t pages_held(std::uint64_t* peak = nullptr) const;

  /// Sums over the arenas (lock-free figures, see SegmentAllocator).
  std::uint64_t free_bytes() const;
  /// The sum of the arenas' peaks of free bytes (each arena's own peak: at least the true peak
  /// of the sum, equal to it while one arena is in use).
  std::uint64_t free_peak() const;
  bool waiting(std::uint64_t completed) const;
  std::uint64_t allocated() const;
  std::uint64_t reserved() const { return free_bytes() + allocated(); }
  /// The arenas' statistics added up (peaks: each arena's, added).
  SegmentAllocator::Stats stats() const;

 private:
  static Block from(const SegmentAllocator::Block& b, int arena) {
    return Block{b.ptr, b.size, b.node, b.ready_at, arena};
  }
  /// Whether `lend` lets a request whose own arena is `own` take arena `i`'s free memory
  /// (`mine`: the thread's claimed arena, or -1).
  bool may_take(int i, int own, int mine, Lend lend) const;
  /// Calls `f(i)` for each arena `i` that `lend` lets a request for `token` take, in order,
  /// until it returns true; returns whether it did.
  template <typename F>
  bool any_reachable(std::uintptr_t token, Lend lend, F&& f) const;

  SharedSlack slack_;                                    // the paged arenas' one budget
  std::array<std::unique_ptr<PageMap>, kArenas> pages_;  // destroyed after the arenas
  std::array<std::unique_ptr<SegmentAllocator>, kArenas> arenas_;
  ArenaActivity activity_;
};

}  // namespace poolshim
