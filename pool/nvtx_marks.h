// NVTX markers for Nsight Systems (issue 17): out-of-memory errors, trims and the host waits
// the shim adds appear beside the kernels, in the domain `poolshim`. nvtx3 is header-only and
// only nvtx_marks.cpp includes it; its functions are static inline and its globals hidden, so
// they are neither exported nor shared with an application's own copy of NVTX.
//
// With no tool attached (NVTX_INJECTION64_PATH unset), NVTX's first call finds no injection
// library and sets every entry to null; the domain is then null and each function here returns
// after one test, formatting nothing. The background thread makes that first call (start());
// the allocation and free hooks call nothing here unless they run out of memory, trim or wait.
#pragma once

#include <cstdint>

#include "function_ref.h"

namespace poolshim::nvtx_marks {

/// Why the shim makes the host wait: the registered message of a range.
enum class Wait {
  sync_free,       // "fence: synchronizing cudaFree" (free mode sync)
  bounded_slack,   // "fence: free memory waits for a fence" (take_block, instead of growing)
  oom_retry,       // "fence: out-of-memory retry"
  idle_trim,       // "fence: idle trim" (blocks no event fence reached)
  legacy_handout,  // "fence: legacy stream handout" (no barrier can order the block)
  foreign_stream,  // "wait: free on another context's stream"
  oom_record,      // "wait: oom record written" (the application may abort right after)
};

/// Why the pool gives memory back to the device (cuMemPoolTrimTo).
enum class Trim {
  idle,       // "trim: idle"
  oom_retry,  // "trim: out-of-memory retry"
  oom,        // "trim: out of memory" (before the real function tries)
};

/// Makes NVTX's first call (which reads NVTX_INJECTION64_PATH and may dlopen the tool), creates
/// the domain, names its categories and registers its strings. The background thread calls it
/// at its start; any function below calls it first too (a function-local static), so an OOM
/// before that start still marks.
void start();

/// Whether a tool took the domain: false when none is attached.
bool active();

/// An out-of-memory error the application gets back: a mark "out of memory: device D, N bytes
/// requested (H), verdict V" with N as its payload (category "out of memory").
void mark_oom(int device, std::uint64_t bytes, const char* verdict);

/// Runs `trim` (which returns the bytes the pool released) inside a push/pop range "trim: why",
/// then marks "trim: why: device D, N bytes released (H)" with N as its payload (category
/// "trim"). Returns what `trim` returned.
std::uint64_t trim(Trim why, int device, FunctionRef<std::uint64_t()> trim);

/// The heap's whole free segments and free pages given back (the cache, DeviceHeap::trim): a mark
/// "cache return: device D, N bytes (H)" with N as its payload (category "trim").
void mark_cache_return(int device, std::uint64_t bytes);

/// A push/pop range around a host wait, for its scope: message `why`, payload the device
/// (category "fence" for a device synchronization, "wait" for the others).
class WaitRange {
 public:
  WaitRange(Wait why, int device);
  ~WaitRange();
  WaitRange(const WaitRange&) = delete;
  WaitRange& operator=(const WaitRange&) = delete;

 private:
  bool pushed_ = false;
};

}  // namespace poolshim::nvtx_marks
