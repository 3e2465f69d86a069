// The allocation event log (issue 17): the bounded lock-free queue, the CSV rows in RMM's
// columns, the router's records and the worker's file.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "background.h"
#include "clock.h"
#include "driver_double.h"
#include "event_log.h"
#include "file_lines.h"
#include "records.h"
#include "router.h"

using namespace poolshim;
using poolshim::testing::async_alloc;
using poolshim::testing::MiB;
using poolshim::testing::read_lines;
using poolshim::testing::RealStub;
using poolshim::testing::Rig;
using poolshim::testing::sync_alloc;

namespace {

AllocationEvent numbered(std::uint64_t n, std::uint32_t thread = 1) {
  AllocationEvent e;
  e.size = n;
  e.thread = thread;
  return e;
}

std::vector<AllocationEvent> pop_all(EventRing& ring) {
  std::vector<AllocationEvent> out;
  AllocationEvent e;
  while (ring.pop(&e)) out.push_back(e);
  return out;
}

std::string row(const AllocationEvent& e, long offset = 0, std::uint64_t start = 0) {
  std::string out;
  append_event_row(out, e, offset, start);
  return out;
}

bool has(const std::string& line, const std::string& piece) {
  return line.find(piece) != std::string::npos;
}

// 2023-11-14 22:13:20.123456789 UTC.
constexpr std::uint64_t kWall = 1700000000123456789ULL;

}  // namespace

TEST_CASE("event ring: capacity rounds up to a power of two, at least 2") {
  CHECK(EventRing(5).capacity() == 8);
  CHECK(EventRing(8).capacity() == 8);
  CHECK(EventRing(1).capacity() == 2);
  CHECK(EventRing(0).capacity() == 2);
}

TEST_CASE("event ring: a full ring drops the next push and counts it, exactly") {
  EventRing ring(8);
  for (std::uint64_t i = 0; i < 8; ++i) CHECK(ring.push(numbered(i)));
  CHECK_FALSE(ring.push(numbered(8)));
  CHECK_FALSE(ring.push(numbered(9)));
  CHECK(ring.accepted() == 8);
  CHECK(ring.dropped() == 2);
  const auto out = pop_all(ring);
  REQUIRE(out.size() == 8);
  for (std::uint64_t i = 0; i < 8; ++i) CHECK(out[i].size == i);  // in push order
  CHECK(ring.push(numbered(10)));                                 // room again
  CHECK(ring.dropped() == 2);
  CHECK(pop_all(ring).size() == 1);
}

TEST_CASE("event ring: an empty ring pops nothing") {
  EventRing ring(4);
  AllocationEvent e;
  CHECK_FALSE(ring.pop(&e));
  CHECK(ring.push(numbered(1)));
  CHECK(ring.pop(&e));
  CHECK_FALSE(ring.pop(&e));
}

TEST_CASE("event ring: many laps round a small ring keep the order") {
  EventRing ring(4);
  std::uint64_t next_out = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    REQUIRE(ring.push(numbered(i)));
    if (i % 3 == 2) {
      for (const auto& e : pop_all(ring)) CHECK(e.size == next_out++);
    }
  }
  for (const auto& e : pop_all(ring)) CHECK(e.size == next_out++);
  CHECK(next_out == 1000);
  CHECK(ring.dropped() == 0);
}

TEST_CASE("event ring: threads pushing at once: every push is taken or dropped, each in order") {
  constexpr int kThreads = 4;
  constexpr std::uint64_t kPushes = 20000;
  EventRing ring(256);
  std::atomic<int> running{kThreads};
  std::vector<std::uint64_t> taken(kThreads, 0);
  std::vector<std::uint64_t> last(kThreads, 0);  // 1 + the last sequence number seen
  bool in_order = true;
  std::thread consumer([&] {
    AllocationEvent e;
    for (;;) {
      const bool done = running.load(std::memory_order_acquire) == 0;
      while (ring.pop(&e)) {
        const auto t = static_cast<std::size_t>(e.thread);
        if (e.size + 1 <= last[t]) in_order = false;
        last[t] = e.size + 1;
        ++taken[t];
      }
      if (done) break;
    }
  });
  std::vector<std::thread> producers;
  std::vector<std::uint64_t> accepted(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < kPushes; ++i) {
        if (ring.push(numbered(i, static_cast<std::uint32_t>(t)))) ++accepted[t];
      }
      running.fetch_sub(1, std::memory_order_release);
    });
  }
  for (auto& p : producers) p.join();
  consumer.join();
  std::uint64_t total_taken = 0;
  for (int t = 0; t < kThreads; ++t) {
    CHECK(taken[t] == accepted[t]);
    total_taken += taken[t];
  }
  CHECK(in_order);
  CHECK(total_taken == ring.accepted());
  CHECK(total_taken + ring.dropped() == kThreads * kPushes);
}

TEST_CASE("event log csv: the header is RMM's six columns, then poolshim's") {
  CHECK(std::string(event_log_header()) == "Thread,Time,Action,Pointer,Size,Stream,Device,Site,T");
}

TEST_CASE("event log csv: an allocation row, exactly") {
  AllocationEvent e;
  e.thread = 4242;
  e.wall_ns = kWall;
  e.mono_ns = 5000000001ULL;
  e.pointer = 0x7f0000001000;
  e.size = 256;
  e.stream = 0;
  e.device = 0;
  e.site = 3;
  e.action = EventAction::allocate;
  CHECK(row(e, 0, 1000000000ULL) ==
        "4242,22:13:20.123456,allocate,0x7f0000001000,256,0x0,0,3,"
        "4.000000001");
}

TEST_CASE("event log csv: free and allocate failure rows, exactly") {
  AllocationEvent e;
  e.thread = 7;
  e.wall_ns = kWall;
  e.mono_ns = 250;
  e.pointer = 0x30000a00;
  e.size = 1048576;
  e.stream = 0x55d0c0ffee10;
  e.device = 1;
  e.action = EventAction::free;
  CHECK(row(e) == "7,22:13:20.123456,free,0x30000a00,1048576,0x55d0c0ffee10,1,0,0.000000250");
  e.action = EventAction::allocate_failure;
  e.pointer = 0;
  CHECK(row(e) == "7,22:13:20.123456,allocate failure,0x0,1048576,0x55d0c0ffee10,1,0,0.000000250");
}

TEST_CASE("event log csv: the time of day is local: the offset applies and wraps at midnight") {
  AllocationEvent e;
  e.wall_ns = kWall;
  CHECK(has(row(e, 3600), ",23:13:20.123456,"));
  CHECK(has(row(e, 2 * 3600), ",00:13:20.123456,"));
  e.wall_ns = 1699921800000000000ULL;  // 2023-11-14 00:30:00 UTC
  CHECK(has(row(e, -3600), ",23:30:00.000000,"));
  CHECK(has(row(e, 19800), ",06:00:00.000000,"));  // UTC+5:30
}

TEST_CASE("event log csv: a time before the start is t 0") {
  AllocationEvent e;
  e.mono_ns = 10;
  CHECK(has(row(e, 0, 20), ",0.000000000"));
}

TEST_CASE("event log: a record carries the thread's kernel id and a wall time near now") {
  EventLog log(4);
  const auto before = static_cast<std::uint64_t>(std::time(nullptr));
  log.record(EventAction::allocate, 0x1000, 64, 0x2, 3, 9);
  AllocationEvent e;
  REQUIRE(log.ring().pop(&e));
  CHECK(e.thread == static_cast<std::uint32_t>(::syscall(SYS_gettid)));
  CHECK(e.wall_ns / 1000000000ULL >= before);
  CHECK(e.wall_ns / 1000000000ULL <= before + 2);
  CHECK(e.pointer == 0x1000);
  CHECK(e.size == 64);
  CHECK(e.stream == 0x2);
  CHECK(e.device == 3);
  CHECK(e.site == 9);
}

TEST_CASE("router events: pooled allocations and frees, sync and async, in order") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  EventLog log(64);
  router.set_event_log(&log);
  RealStub never;
  void* a = sync_alloc(router, 0, 1000, never);
  CUstream stream = nullptr;
  REQUIRE(d.api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  void* b = async_alloc(router, 0, 2048, stream, never);
  router.free_async(b, stream, never);
  router.free_sync(a, 0, never);
  CHECK(never.calls == 0);
  const auto out = pop_all(log.ring());
  REQUIRE(out.size() == 4);
  const auto s = reinterpret_cast<std::uintptr_t>(stream);
  CHECK(out[0].action == EventAction::allocate);
  CHECK(out[0].pointer == reinterpret_cast<std::uintptr_t>(a));
  CHECK(out[0].size == 1000);
  CHECK(out[0].stream == 0);
  CHECK(out[0].device == 0);
  CHECK(out[1].action == EventAction::allocate);
  CHECK(out[1].pointer == reinterpret_cast<std::uintptr_t>(b));
  CHECK(out[1].size == 2048);
  CHECK(out[1].stream == s);
  CHECK(out[2].action == EventAction::free);
  CHECK(out[2].pointer == reinterpret_cast<std::uintptr_t>(b));
  CHECK(out[2].size == 2048);
  CHECK(out[2].stream == s);
  CHECK(out[3].action == EventAction::free);
  CHECK(out[3].pointer == reinterpret_cast<std::uintptr_t>(a));
  CHECK(out[3].size == 1000);
  CHECK(out[3].stream == 0);
  d.api.cuStreamDestroy_v2(stream);
}

TEST_CASE("router events: a failed allocation is one allocate failure row of the request") {
  Rig rig(1, 16 * MiB, testing::with_segments());
  auto& [d, config, events, router] = rig;
  EventLog log(64);
  router.set_event_log(&log);
  RealStub oom{RealResult::out_of_memory};
  CHECK(sync_alloc(router, 0, 20 * MiB, oom) == nullptr);
  const auto out = pop_all(log.ring());
  REQUIRE(out.size() == 1);
  CHECK(out[0].action == EventAction::allocate_failure);
  CHECK(out[0].pointer == 0);
  CHECK(out[0].size == 20 * MiB);
  CHECK(out[0].device == 0);
}

TEST_CASE("router events: no row for a foreign pointer's free or without a log") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  EventLog log(64);
  RealStub real;
  void* a = sync_alloc(router, 0, 4096, real);  // no log yet
  router.set_event_log(&log);
  int host_object = 0;
  router.free_sync(&host_object, 0, real);
  router.set_event_log(nullptr);
  router.free_sync(a, 0, real);
  CHECK(pop_all(log.ring()).empty());
  CHECK(log.ring().dropped() == 0);
}

TEST_CASE("router events: observe mode records the real function's allocations and frees") {
  Config c = Config::defaults();
  c.mode = "observe";
  Rig rig(1, 64 * MiB, c);
  auto& [d, config, events, router] = rig;
  EventLog log(64);
  router.set_event_log(&log);
  RealStub real;
  CUdeviceptr p = 0;
  auto adapt = [&](std::size_t n, CUdeviceptr* native) {
    const RealResult r = real(n, native);
    p = *native;
    return r;
  };
  CHECK_FALSE(router.allocate_sync(0, 512, &p, adapt));
  router.free_sync(reinterpret_cast<void*>(p), 0, real);
  const auto out = pop_all(log.ring());
  REQUIRE(out.size() == 2);
  CHECK(out[0].action == EventAction::allocate);
  CHECK(out[0].pointer == p);
  CHECK(out[0].size == 512);
  CHECK(out[1].action == EventAction::free);
  CHECK(out[1].pointer == p);
  CHECK(out[1].size == 512);
}

namespace {

// A router and a worker with an event log of `capacity` records writing `csv` (a temporary
// file unless given), the JSON log beside it; both files are removed at the end.
struct EventsRig {
  Rig rig{1, 64 * MiB};
  std::string log_path;
  std::string csv_path;
  EventLog log;
  BackgroundWorker worker;
  RealStub never;

  EventsRig(const char* tag, std::size_t capacity, std::string csv = {}, bool at_exit_only = false)
      : log_path(temp_name(tag, ".jsonl")),
        csv_path(csv.empty() ? temp_name(tag, ".csv") : csv),
        log(capacity),
        worker(rig.router, rig.events, info(log_path, csv_path), {}) {
    std::remove(log_path.c_str());
    if (csv.empty()) std::remove(csv_path.c_str());
    rig.router.set_event_log(&log);
    worker.set_event_log(&log, at_exit_only);
  }
  ~EventsRig() {
    std::remove(log_path.c_str());
    std::remove(csv_path.c_str());
  }
  void* alloc(std::size_t bytes) { return sync_alloc(rig.router, 0, bytes, never); }
  void free(void* p) { rig.router.free_sync(p, 0, never); }
  std::string exit_record() { return read_lines(log_path).back(); }

  static std::string temp_name(const char* tag, const char* ext) {
    return "/tmp/poolshim-unit-" + std::to_string(getpid()) + "-" + tag + ext;
  }
  static ProcessInfo info(const std::string& log, const std::string& events) {
    ProcessInfo i;
    i.pid = 4242;
    i.host = "testhost";
    i.rank = "0";
    i.start_mono_ns = now_ns();
    i.log_path = log;
    i.events_path = events;
    return i;
  }
};

}  // namespace

TEST_CASE("worker events: header, one row per call, counts in the exit record, mode 0600") {
  EventsRig r("ev", 64);
  r.worker.begin();
  void* a = r.alloc(1000);
  r.worker.drain_event_log();
  r.free(a);
  r.worker.end(ExitExtras{});

  const auto rows = read_lines(r.csv_path);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0] == "Thread,Time,Action,Pointer,Size,Stream,Device,Site,T");
  char pointer[32];
  std::snprintf(pointer, sizeof pointer, "0x%lx", reinterpret_cast<unsigned long>(a));
  CHECK(has(rows[1], std::string(",allocate,") + pointer + ",1000,0x0,0,0,"));
  CHECK(has(rows[2], std::string(",free,") + pointer + ",1000,0x0,0,0,"));
  struct stat st {};
  REQUIRE(::stat(r.csv_path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(has(r.exit_record(), "\"event_log_written\":2,\"event_log_dropped\":0"));
  CHECK(r.worker.event_log_written() == 2);
}

TEST_CASE("worker events: a full queue's drops are counted in the exit record") {
  EventsRig r("evdrop", 4, {}, true);
  r.worker.begin();
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(r.alloc(4096));
  for (void* b : blocks) r.free(b);  // 10 records, room for 4
  r.worker.end(ExitExtras{});
  CHECK(read_lines(r.csv_path).size() == 1 + 4);
  CHECK(has(r.exit_record(), "\"event_log_written\":4,\"event_log_dropped\":6"));
}

TEST_CASE("worker events: a file that cannot be opened is one warning and recording stops") {
  EventsRig r("evfail", 16, "/nonexistent-poolshim-dir/events.csv");
  void* a = r.alloc(4096);  // queued before the file is tried
  r.worker.begin();
  CHECK(r.rig.router.event_log() == nullptr);
  r.free(a);  // not recorded any more
  r.worker.end(ExitExtras{});
  const auto lines = read_lines(r.log_path);
  REQUIRE(lines.size() >= 3);
  CHECK(has(lines[1], "\"type\":\"warning\""));
  CHECK(has(lines[1],
            "POOLSHIM_EVENTS: cannot open log /nonexistent-poolshim-dir/events.csv: No such file "
            "or directory; the event log stops"));
  CHECK(has(lines.back(), "\"event_log_written\":0,\"event_log_dropped\":1"));
}

TEST_CASE("worker events: off, the exit record's event log counts are null") {
  Rig rig(1, 64 * MiB);
  const std::string log_path = EventsRig::temp_name("evoff", ".jsonl");
  std::remove(log_path.c_str());
  BackgroundWorker worker(rig.router, rig.events, EventsRig::info(log_path, ""), {});
  worker.begin();
  worker.end(ExitExtras{});
  CHECK(has(read_lines(log_path).back(), "\"event_log_written\":null,\"event_log_dropped\":null"));
  std::remove(log_path.c_str());
}

TEST_CASE("worker events: an existing file of the user's is emptied first, as RMM's adaptor does") {
  const std::string csv = EventsRig::temp_name("evold", ".csv");
  {
    std::ofstream old(csv);
    old << "stale,content\nmore\n";
  }
  EventsRig r("evold", 64, csv);
  r.worker.begin();
  r.worker.end(ExitExtras{});
  const auto rows = read_lines(r.csv_path);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0] == event_log_header());
}
