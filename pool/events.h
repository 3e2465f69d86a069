// Rare events (warnings, out-of-memory reports) travel from hooks to the background thread
// through this bounded queue, so that no hook does I/O. Not a hot path: a plain mutex is fine.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "stats.h"

namespace poolshim {

/// What the pool saw when an allocation failed for good (DESIGN §5, `oom` record).
struct OomReport {
  std::uint64_t t_ns = 0;  // monotonic
  int device = -1;
  std::uint64_t request = 0;
  std::uintptr_t stream = 0;
  bool async = false;
  bool retried = false;  // a trim-and-retry was tried
  bool device_info_valid = false;
  std::uint64_t device_free = 0;
  std::uint64_t device_total = 0;
  std::uint64_t reserved = 0;  // pool figures at the failure
  std::uint64_t used = 0;
  std::uint64_t released_after = 0;  // unused pool memory given back before the real call
  std::uint64_t live_bytes = 0;      // requested bytes in live pooled allocations
  std::uint64_t live_count = 0;
  std::uint64_t cap = 0;   // the pool's cap (POOLSHIM_LIMIT), 0 when none
  std::uint32_t site = 0;  // call site of the failed request (POOLSHIM_BACKTRACE), 0: none
  int error = 0;           // the code the application got back
  bool observe = false;    // observe mode: the figures are the tracked native allocations
};

/// Why the allocation failed (README, the `oom` record's `verdict`): the pool's unused memory,
/// or the device's free memory within the cap, was at least the request (fragmentation); the
/// cap's headroom was less than the request (cap); or the memory is in use (exhausted).
/// Arithmetic on the report only: the hook that publishes it counts the verdict.
OomVerdict oom_verdict_of(const OomReport& r);

struct Event {
  enum class Kind { warning, oom } kind = Kind::warning;
  std::string text;  // warning
  OomReport oom;
  std::uint64_t ticket = 0;
};

class EventQueue {
 public:
  static constexpr std::size_t kCapacity = 1024;

  /// Queues a warning; returns its ticket (0 when the queue was full and it was dropped).
  std::uint64_t push_warning(std::string text);
  std::uint64_t push_oom(const OomReport& report);
  /// Blocks up to `timeout` until the record with `ticket` has been written (used after an
  /// OOM, so the report survives an abort() that often follows it). False on timeout.
  bool wait_written(std::uint64_t ticket, std::chrono::milliseconds timeout);

  /// Consumer side: moves queued events into `out`.
  void drain(std::vector<Event>& out);
  /// Consumer side: every event up to `ticket` is written.
  void mark_written(std::uint64_t ticket);
  /// Consumer side: waits until an event arrives, a stop is requested or `timeout` passes.
  /// Returns true when a stop has been requested.
  bool wait_for_work(std::chrono::milliseconds timeout);
  /// Asks the consumer to finish (it drains what is queued first).
  void request_stop();
  std::uint64_t dropped() const;
  /// Whether events wait to be drained.
  bool pending() const;

 private:
  std::uint64_t push(Event e);

  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable written_;
  std::deque<Event> queue_;
  std::uint64_t next_ticket_ = 1;
  std::uint64_t written_ticket_ = 0;
  std::uint64_t dropped_ = 0;
  bool stop_ = false;
};

}  // namespace poolshim
