#include "event_log.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>

#include "clock.h"

namespace poolshim {

namespace {

std::size_t round_up_to_power_of_two(std::size_t n) {
  std::size_t p = 2;
  while (p < n) p <<= 1;
  return p;
}

// The kernel's id of the calling thread, asked once per thread (a syscall is too dear for
// every hook). A forked child of a started process never records (shim.h:
// bookkeeping_allowed), so a value inherited across fork() is never written.
std::uint32_t this_thread_id() {
  static thread_local std::uint32_t id = 0;
  if (id == 0) id = static_cast<std::uint32_t>(::syscall(SYS_gettid));
  return id;
}

std::uint64_t realtime_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ULL +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

const char* action_name(EventAction a) {
  switch (a) {
    case EventAction::allocate:
      return "allocate";
    case EventAction::free:
      return "free";
    case EventAction::allocate_failure:
      return "allocate failure";
  }
  return "allocate failure";
}

}  // namespace

EventRing::EventRing(std::size_t capacity)
    : cells_(new Cell[round_up_to_power_of_two(capacity)]),
      mask_(round_up_to_power_of_two(capacity) - 1) {
  for (std::size_t i = 0; i <= mask_; ++i) cells_[i].sequence.store(i, std::memory_order_relaxed);
}

bool EventRing::push(const AllocationEvent& event) {
  std::uint64_t pos = enqueue_pos_.load(std::memory_order_relaxed);
  Cell* cell = nullptr;
  for (;;) {
    cell = &cells_[pos & mask_];
    const std::uint64_t seq = cell->sequence.load(std::memory_order_acquire);
    const auto dif = static_cast<std::int64_t>(seq - pos);
    if (dif == 0) {
      // The cell is free for position `pos`: claim the position.
      if (enqueue_pos_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
    } else if (dif < 0) {
      // The cell still holds the record of one lap ago: the queue is full.
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    } else {
      pos = enqueue_pos_.load(std::memory_order_relaxed);  // another producer took it
    }
  }
  cell->event = event;
  cell->sequence.store(pos + 1, std::memory_order_release);  // readable now
  return true;
}

bool EventRing::pop(AllocationEvent* out) {
  std::uint64_t pos = dequeue_pos_.load(std::memory_order_relaxed);
  Cell* cell = nullptr;
  for (;;) {
    cell = &cells_[pos & mask_];
    const std::uint64_t seq = cell->sequence.load(std::memory_order_acquire);
    const auto dif = static_cast<std::int64_t>(seq - (pos + 1));
    if (dif == 0) {
      if (dequeue_pos_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
    } else if (dif < 0) {
      return false;  // empty, or its producer has claimed the cell but not yet written it
    } else {
      pos = dequeue_pos_.load(std::memory_order_relaxed);
    }
  }
  *out = cell->event;
  cell->sequence.store(pos + mask_ + 1, std::memory_order_release);  // free for the next lap
  return true;
}

EventLog::EventLog(std::size_t capacity) : ring_(capacity) {
  const std::uint64_t mono = now_ns();
  wall_minus_mono_ns_ = static_cast<std::int64_t>(realtime_ns() - mono);
}

void EventLog::record(EventAction action, std::uintptr_t pointer, std::uint64_t size,
                      std::uintptr_t stream, int device, std::uint32_t site) {
  AllocationEvent e;
  e.mono_ns = now_ns();
  e.wall_ns = e.mono_ns + static_cast<std::uint64_t>(wall_minus_mono_ns_);
  e.pointer = pointer;
  e.size = size;
  e.stream = stream;
  e.thread = this_thread_id();
  e.device = device;
  e.site = site;
  e.action = action;
  ring_.push(e);
}

const char* event_log_header() {
  return "Thread,Time,Action,Pointer,Size,Stream,Device,Site,T";
}

void append_event_row(std::string& out, const AllocationEvent& e, long utc_offset_s,
                      std::uint64_t start_mono_ns) {
  const std::int64_t local_s = static_cast<std::int64_t>(e.wall_ns / 1000000000ULL) + utc_offset_s;
  const std::int64_t day_s = ((local_s % 86400) + 86400) % 86400;
  const auto micros = static_cast<unsigned>((e.wall_ns % 1000000000ULL) / 1000);
  const std::uint64_t since = e.mono_ns > start_mono_ns ? e.mono_ns - start_mono_ns : 0;
  char buf[256];
  const int n =
      std::snprintf(buf, sizeof buf,
                    "%" PRIu32 ",%02d:%02d:%02d.%06u,%s,0x%" PRIxPTR ",%" PRIu64 ",0x%" PRIxPTR
                    ",%" PRId32 ",%" PRIu32 ",%" PRIu64 ".%09" PRIu64,
                    e.thread, static_cast<int>(day_s / 3600), static_cast<int>(day_s / 60 % 60),
                    static_cast<int>(day_s % 60), micros, action_name(e.action), e.pointer, e.size,
                    e.stream, e.device, e.site, static_cast<std::uint64_t>(since / 1000000000U),
                    static_cast<std::uint64_t>(since % 1000000000U));
  if (n > 0) out.append(buf, static_cast<std::size_t>(n) < sizeof buf ? n : sizeof buf - 1);
}

long local_utc_offset(std::int64_t unix_s) {
  const time_t t = static_cast<time_t>(unix_s);
  struct tm tm_buf {};
  if (localtime_r(&t, &tm_buf) == nullptr) return 0;
  return tm_buf.tm_gmtoff;
}

}  // namespace poolshim
