// Call sites of allocations (POOLSHIM_BACKTRACE=N): the hot path captures up to N return
// addresses and interns them here, keeping a 32-bit id in the allocation's table entry. No
// symbolization and no allocation on the hot path: the table is one mmap'd array of fixed
// slots claimed with a compare-and-swap; names are resolved when a report is written.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace poolshim {

constexpr int kMaxCallSiteFrames = 32;

class CallSiteTable {
 public:
  /// `capacity` distinct call sites (a power of two); more are recorded as unknown (id 0).
  explicit CallSiteTable(std::size_t capacity = std::size_t{1} << 16);
  ~CallSiteTable();
  CallSiteTable(const CallSiteTable&) = delete;
  CallSiteTable& operator=(const CallSiteTable&) = delete;

  /// The id of this sequence of return addresses (innermost first), interning it on first
  /// sight. 0 when `depth` is 0 or the table is full.
  std::uint32_t intern(const std::uintptr_t* frames, int depth);
  /// The frames of `id`; empty for 0 or an unknown id.
  std::vector<std::uintptr_t> frames(std::uint32_t id) const;
  /// Call sites that did not fit (recorded as id 0).
  std::uint64_t overflowed() const { return overflowed_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    std::atomic<std::uint64_t> hash;  // 0 = free
    std::atomic<bool> ready;          // frames written
    std::int32_t depth;
    std::uintptr_t frames[kMaxCallSiteFrames];
  };
  Slot* slots_ = nullptr;
  std::size_t capacity_ = 0;
  std::atomic<std::uint64_t> overflowed_{0};
};

/// Captures the calling thread's return addresses (innermost first) into `out` (at most
/// `max_frames`, clamped to kMaxCallSiteFrames), leaving out frame 0 (capture_frames itself)
/// and the leading frames that lie in [skip_begin, skip_end) (the shim's own code). Returns
/// how many were stored. The addresses are those glibc's backtrace() gives (_Unwind_GetIP:
/// return addresses); the walk (_Unwind_Backtrace) stops as soon as `max_frames` are stored,
/// and after max_frames + 16 frames in all (backtrace(max_frames + 16) before).
int capture_frames(std::uintptr_t* out, int max_frames, std::uintptr_t skip_begin,
                   std::uintptr_t skip_end);

/// The id in `table` of the calling thread's call site: what
///   n = capture_frames(frames, max_frames, skip_begin, skip_end); table.intern(frames, n)
/// gives (frame 0 being capture_site's caller instead of capture_frames' caller), 0 when
/// `max_frames` <= 0. A repeated call site usually costs a few loads instead of an unwind:
///
/// Each thread keeps a small cache of call chains it has unwound, keyed by capture_site's own
/// frame address (`key`) and by (table, max_frames, skip range). For every frame k that an
/// unwind walked (k >= 1; frame 0 is capture_site) the entry holds the stack slot of its
/// return address, CFA_k - 8 on x86-64, and the value found there, IP_k (the address
/// reported for that frame; the fill checks that the slot does hold it). A later capture on
/// the same thread with the same key returns the cached id when every slot still holds its
/// value, without unwinding; otherwise it unwinds, interns and replaces an entry.
///
/// What a hit proves: capture_site's frame is at the same address, so its return address slot
/// is the same one, and it holds IP_1: the same caller, at the same call instruction. For a
/// frame whose size is fixed at a given instruction (CFA = SP + constant), the same IP and the
/// same callee CFA give the same CFA, so the next slot checked is that frame's real return
/// address slot; by induction every reported IP_k is the one an unwind would report now, and
/// the walk ends where it ended (it stops on max_frames, on the frame limit, or on a frame
/// decided by its IP alone). A frame addressed by its frame pointer (CFA = rbp + 16: alloca,
/// VLAs, stack realignment for over-aligned locals, code built with frame pointers) can sit
/// at another address while everything inside it stays put, leaving its old return address
/// in stack space nobody wrote since (a review reproduced that: with a realigning frame the
/// first caller's id came back for the second). Such a frame's rbp value is its position, and
/// the innermost function inside it that changed rbp saved it in its prologue (at the latest
/// capture_site does), in a slot written at every call: the entry checks that copy too, and a
/// chain where it is not found is not cached. (Any other copy could be a leftover: the same
/// review defeated a first version that took the first copy it found.) A walk that goes
/// through a signal frame, that fails, or whose slots do not hold what the unwinder reported
/// is not cached either.
///
/// The residual risk: a frame whose position is not fixed by its callee's and not kept in
/// rbp (GCC's realignment through a DRAP register, whose CFA is an expression), with stale
/// stack data equal to its old return address: the hit then reports the old chain from that
/// frame outwards (the frames inside it are still right). (Code unloaded and other code
/// loaded at the same addresses is the same case.)
///
/// Known limits of the bookkeeping: the thread's stack is, in /proc/self/maps, "[stack]" for
/// the main thread (extended to RLIMIT_STACK) and the mapping that holds the thread's glibc
/// descriptor for any other, and the kernel merges adjacent anonymous mappings of the same
/// protection, so a fiber stack mapped right next to a thread's stack can count as inside it
/// (harmless for fixed-size frames: a hit reads only what an unwind would read); a signal handler
/// that siglongjmps out of a capture leaves that thread unwinding every time.
///
/// The cache is per thread (stack addresses mean something only on their own stack) and is
/// used only while the key and every slot lie inside the thread's stack: on a foreign stack
/// (fibers, makecontext, sigaltstack) every capture unwinds. Its memory is one mmap'd block
/// per thread (kSiteCacheEntries entries, set-associative), made on the thread's first
/// capture and unmapped at thread exit (a pthread key's destructor, the key made at load
/// time); without it (mmap failed, stack unknown, the key not one of glibc's first 32) every
/// capture unwinds. Every capture is async-signal-safe as far as the shim goes (a hook may run
/// in a signal handler): the hit path reads a few stack words; the first capture of a thread
/// reads /proc/self/maps with open/read into a stack buffer, mmaps its block and sets the key,
/// with no allocation and no lock (issue 12: pthread_getattr_np and a thread_local destructor
/// did both). The unwind itself is libgcc's _Unwind_Backtrace, warmed up at start.
std::uint32_t capture_site(CallSiteTable& table, int max_frames, std::uintptr_t skip_begin,
                           std::uintptr_t skip_end);

/// Entries of each thread's call-chain cache (see capture_site): 8 sets of 4 ways, ~20 KiB.
constexpr int kSiteCacheEntries = 32;

/// The calling thread's capture_site counts (for tests and benchmarks): captures answered
/// from the cache, and captures that unwound.
struct SiteCacheCounts {
  std::uint64_t hits = 0;
  std::uint64_t unwinds = 0;
};
SiteCacheCounts site_cache_counts();

/// Loads the unwinder once (its first use may dlopen libgcc_s, allocate and take the loader
/// lock; both backtrace() and _Unwind_Backtrace are warmed): call before the hot path
/// captures anything.
void warm_up_unwinder();

}  // namespace poolshim
