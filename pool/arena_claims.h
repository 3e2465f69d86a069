// Which threads hold which of the heaps' named-stream arenas (DESIGN §7). A thread's first
// request on a named stream claims the arena the fewest live threads hold (the lowest such
// index), and its exit gives the claim back (a pthread key's destructor), so that a new thread
// takes over an exited thread's arena and the free memory in it, as mimalloc's threads reclaim
// abandoned segments, instead of borrowing from arenas that live threads use. With every arena
// held, threads share them, fewest holders first. Arena 0 (cudaMalloc and the legacy stream) is
// never claimed: every thread uses it.
#pragma once

#include <array>
#include <atomic>

namespace poolshim {

/// Arenas of each device heap (DeviceHeap::kArenas): 0 and fifteen to claim.
constexpr int kHeapArenas = 16;

class ArenaClaims {
 public:
  static constexpr int kMaxArenas = 32;

  /// Claims over arenas 1 .. count-1 (count at most kMaxArenas).
  explicit ArenaClaims(int count);

  /// The arena the fewest holders hold (lowest index among them), now held once more.
  int claim();
  /// Gives back one claim of `arena` (from claim()).
  void release(int arena);
  /// How many live claims `arena` has (0 for arena 0 and for arenas out of range).
  int holders(int arena) const;

 private:
  int count_;
  std::array<std::atomic<int>, kMaxArenas> holders_{};
};

/// The process-wide claims over the device heaps' arenas (DeviceHeap::kArenas).
ArenaClaims& arena_claims();

/// The calling thread's arena, claimed from arena_claims() at its first call and given back
/// when the thread exits.
int thread_arena();

/// The calling thread's arena if it has claimed one, else -1 (claims nothing).
int thread_arena_if_claimed();

}  // namespace poolshim
