// The allocation event log (issue 17, POOLSHIM_EVENTS; DESIGN §5.1): one record per allocation
// and free, pushed by the hook's thread into a bounded lock-free queue and written as CSV in
// RMM's columns by the background thread. A push never allocates, locks, blocks or does I/O;
// a full queue drops the record and counts it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace poolshim {

/// RMM's action names (rmm/benchmarks/utilities/log_parser.hpp accepts exactly these three).
enum class EventAction : std::uint8_t { allocate, free, allocate_failure };

/// One allocation, free or failed allocation, as the hook saw it.
struct AllocationEvent {
  std::uint64_t mono_ns = 0;   // CLOCK_MONOTONIC
  std::uint64_t wall_ns = 0;   // CLOCK_REALTIME, derived from mono_ns (EventLog::record)
  std::uintptr_t pointer = 0;  // 0 for a failure
  std::uint64_t size = 0;      // the bytes asked for (a free: its allocation's)
  std::uintptr_t stream = 0;   // the call's stream; 0 for cudaMalloc and cudaFree
  std::uint32_t thread = 0;    // the kernel's thread id (gettid), as spdlog's %t in RMM's log
  std::int32_t device = -1;
  std::uint32_t site = 0;  // call-site id of the allocation (POOLSHIM_BACKTRACE), 0: none
  EventAction action = EventAction::allocate;
};
static_assert(sizeof(AllocationEvent) == 56, "a record and its sequence number fill 64 bytes");

/// A bounded multi-producer multi-consumer queue of fixed capacity (Dmitry Vyukov's bounded
/// MPMC queue): each cell carries a sequence number that says whose turn it is, so a push is
/// one compare-and-swap on the tail and two stores, with no lock and no allocation. Records
/// come out in the order their pushes claimed a cell, one order for all threads: a free pushed
/// before its block goes back to the heap precedes the allocation that reuses the block.
class EventRing {
 public:
  /// Capacity rounded up to a power of two (at least 2). Allocates the cells here, once.
  explicit EventRing(std::size_t capacity);
  EventRing(const EventRing&) = delete;
  EventRing& operator=(const EventRing&) = delete;

  /// Queues `event`; false (and one more dropped) when the queue is full. Never blocks.
  bool push(const AllocationEvent& event);
  /// Takes the oldest record; false when none is ready (empty, or the oldest push is still
  /// writing its cell: it is taken next time).
  bool pop(AllocationEvent* out);

  std::size_t capacity() const { return mask_ + 1; }
  /// Records queued so far (pushes that found room).
  std::uint64_t accepted() const { return enqueue_pos_.load(std::memory_order_relaxed); }
  /// Pushes that found the queue full.
  std::uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  struct alignas(64) Cell {
    std::atomic<std::uint64_t> sequence{0};
    AllocationEvent event;
  };
  std::unique_ptr<Cell[]> cells_;
  std::size_t mask_;
  alignas(64) std::atomic<std::uint64_t> enqueue_pos_{0};
  alignas(64) std::atomic<std::uint64_t> dequeue_pos_{0};
  alignas(64) std::atomic<std::uint64_t> dropped_{0};
};

/// The hook side of the event log: stamps a record with the thread and the time and pushes it.
class EventLog {
 public:
  /// 65536 records of 64 bytes (4 MiB): at a drain every 20 ms, 3 million events a second.
  static constexpr std::size_t kDefaultCapacity = std::size_t{1} << 16;

  explicit EventLog(std::size_t capacity = kDefaultCapacity);
  /// One clock read (CLOCK_MONOTONIC through the vDSO) and one push; the wall time is the
  /// monotonic time plus the offset between the two clocks taken at construction.
  void record(EventAction action, std::uintptr_t pointer, std::uint64_t size, std::uintptr_t stream,
              int device, std::uint32_t site);
  EventRing& ring() { return ring_; }
  const EventRing& ring() const { return ring_; }

 private:
  EventRing ring_;
  std::int64_t wall_minus_mono_ns_ = 0;
};

/// The CSV header: RMM's six columns, then poolshim's.
const char* event_log_header();

/// Appends one CSV row (no newline) for `e`: Thread (decimal), Time (HH:MM:SS.ffffff, the wall
/// time of day at `utc_offset_s` from UTC, as spdlog's "%H:%M:%S.%f" in RMM's pattern), Action,
/// Pointer (0x and lowercase hex, "0x0" for none, as fmt prints a pointer), Size (decimal),
/// Stream (as Pointer), Device, Site, T (seconds since `start_mono_ns`, 9 decimals: the
/// JSON log's `t`).
void append_event_row(std::string& out, const AllocationEvent& e, long utc_offset_s,
                      std::uint64_t start_mono_ns);

/// The local time's offset from UTC at `unix_s` (tm_gmtoff), in seconds.
long local_utc_offset(std::int64_t unix_s);

}  // namespace poolshim
