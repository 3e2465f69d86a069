// Call-site capture: capture_frames (the unwind) against glibc's backtrace(), and capture_site
// (its per-thread cache of verified call chains) against capture_frames.
#include <catch2/catch.hpp>

#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "call_sites.h"

using poolshim::CallSiteTable;
using poolshim::capture_frames;
using poolshim::capture_site;
using poolshim::kMaxCallSiteFrames;
using poolshim::site_cache_counts;
using poolshim::SiteCacheCounts;

// The probe lives in a section of its own: its range, given as the skip range, stands for the
// shim's own code, so that capture_site and capture_frames, called from two instructions of
// the probe, report the same frames (from the probe's caller outwards).
extern "C" {
extern const char __start_poolshim_cs_probe[] __attribute__((visibility("hidden")));
extern const char __stop_poolshim_cs_probe[] __attribute__((visibility("hidden")));
}

#define NOIPA __attribute__((noipa))
#define PROBE __attribute__((noipa, section("poolshim_cs_probe")))
// Before a loop whose iterations must reach capture_site through one call instruction each
// (an unrolled loop calls from several: several call sites).
#define ONE_CALL_SITE _Pragma("GCC unroll 1")

namespace {

struct Probe {
  CallSiteTable* table = nullptr;  // capture_site into it when set
  int max = 8;
  bool glibc = false;                    // also backtrace()
  std::uint32_t id = 0;                  // capture_site's answer
  std::vector<std::uintptr_t> cold;      // capture_frames' answer
  std::vector<std::uintptr_t> via_libc;  // backtrace()'s, less its frame 0 (the probe)
  std::uintptr_t mid_frame = 0;          // mid()'s frame address
};

std::uintptr_t probe_begin() {
  return reinterpret_cast<std::uintptr_t>(__start_poolshim_cs_probe);
}
std::uintptr_t probe_end() {
  return reinterpret_cast<std::uintptr_t>(__stop_poolshim_cs_probe);
}

extern "C" int __backtrace(void** buffer, int size);  // glibc exports it (GLIBC_2.2.5)

PROBE void probe(Probe& p) {
  if (p.table != nullptr) p.id = capture_site(*p.table, p.max, probe_begin(), probe_end());
  std::uintptr_t frames[kMaxCallSiteFrames];
  const int n = capture_frames(frames, p.max, probe_begin(), probe_end());
  p.cold.assign(frames, frames + n);
  if (p.glibc) {
    void* raw[kMaxCallSiteFrames + 1];
    // glibc's own entry: a sanitizer build intercepts `backtrace`, and its interceptor's frame
    // would come first.
    const int got = __backtrace(raw, p.max + 1);
    p.via_libc.clear();
    for (int i = 1; i < got; ++i) p.via_libc.push_back(reinterpret_cast<std::uintptr_t>(raw[i]));
  }
  asm volatile("" ::: "memory");
}

NOIPA void site_a(Probe& p) {
  probe(p);
  asm volatile("" ::: "memory");
}

NOIPA void site_b(Probe& p) {
  probe(p);
  asm volatile("" ::: "memory");
}

NOIPA int unskipped(std::uintptr_t* frames) {
  const int n = capture_frames(frames, 4, 0, 0);
  asm volatile("" ::: "memory");
  return n;
}

NOIPA void mid(Probe& p) {
  p.mid_frame = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  probe(p);
  asm volatile("" ::: "memory");
}

// Two callers of mid() alike but for their address (noipa: not folded into one).
NOIPA void outer_1(Probe& p) {
  mid(p);
  asm volatile("" ::: "memory");
}

NOIPA void outer_2(Probe& p) {
  mid(p);
  asm volatile("" ::: "memory");
}

NOIPA void recurse(Probe& p, int depth) {
  if (depth == 0) {
    probe(p);
  } else {
    recurse(p, depth - 1);
  }
  asm volatile("" ::: "memory");
}

SiteCacheCounts since(const SiteCacheCounts& before) {
  const SiteCacheCounts now = site_cache_counts();
  SiteCacheCounts d;
  d.hits = now.hits - before.hits;
  d.unwinds = now.unwinds - before.unwinds;
  return d;
}

// A function that realigns its stack (an over-aligned local: `and rsp, -64`), called from
// two callers whose frames differ by 16 bytes: everything inside it lies at the same
// addresses from both, while its own return address does not.
NOIPA void realigned_inner(Probe& p) {
  p.mid_frame = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  probe(p);
  asm volatile("" ::: "memory");
}

NOIPA void realigning(Probe& p, std::uintptr_t* own_frame) {
  alignas(64) volatile char block[64];
  block[0] = 1;
  *own_frame = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  realigned_inner(p);
  asm volatile("" ::"r"(&block[0]) : "memory");
}

#define REALIGN_CALLER(n, pad_bytes)                                                 \
  NOIPA void realign_caller_##n(Probe& p, std::uintptr_t* own_frame, bool sibling) { \
    volatile char pad[pad_bytes];                                                    \
    pad[0] = 1;                                                                      \
    if (sibling) leave_rbp_copy();                                                   \
    realigning(p, own_frame);                                                        \
    asm volatile("" ::"r"(&pad[0]) : "memory");                                      \
  }
// A frame-pointer function whose callee pushes its rbp: called just before realigning() from
// the same caller, it leaves a copy of the value realigning's rbp will have in the stack that
// realigning's alignment gap then covers and never writes (a review used it to defeat a check
// that took the first copy it found).
extern "C" void poolshim_test_push_rbp();
asm(".text\n.globl poolshim_test_push_rbp\n.type poolshim_test_push_rbp,@function\n"
    "poolshim_test_push_rbp:\n push %rbp\n mov %rsp, %rbp\n pop %rbp\n ret\n");
__attribute__((noinline, optimize("no-omit-frame-pointer"))) void leave_rbp_copy() {
  poolshim_test_push_rbp();
  asm volatile("" ::: "memory");
}

// Frames 16 bytes apart: of four, at least two put realigning's inside at one address.
REALIGN_CALLER(0, 16)
REALIGN_CALLER(1, 32)
REALIGN_CALLER(2, 48)
REALIGN_CALLER(3, 64)
#undef REALIGN_CALLER

}  // namespace

TEST_CASE("call sites: capture_frames gives backtrace()'s return addresses") {
  for (int max : {1, 3, 8, kMaxCallSiteFrames}) {
    Probe p;
    p.max = max;
    p.glibc = true;
    site_a(p);
    INFO("max_frames " << max);
    REQUIRE(!p.cold.empty());
    CHECK(p.cold == p.via_libc);
  }
}

TEST_CASE("call sites: frame 0 is the capturing function's caller, skipped code left out") {
  Probe p;
  site_a(p);
  REQUIRE(p.cold.size() == 8);
  // Frame 0: the return address into site_a (the probe, in the skip range, is left out).
  const auto a = reinterpret_cast<std::uintptr_t>(&site_a);
  CHECK(p.cold[0] > a);
  CHECK(p.cold[0] < a + 64);
  for (std::uintptr_t f : p.cold) CHECK((f < probe_begin() || f >= probe_end()));
  // With nothing skipped, frame 0 is capture_frames' caller, frame 1 its caller's.
  std::uintptr_t frames[4];
  REQUIRE(unskipped(frames) == 4);
  const auto u = reinterpret_cast<std::uintptr_t>(&unskipped);
  CHECK(frames[0] > u);
  CHECK(frames[0] < u + 64);
}

TEST_CASE("call sites: max_frames limits the depth exactly") {
  CallSiteTable table;
  std::vector<std::uintptr_t> deep;
  ONE_CALL_SITE
  for (int max : {kMaxCallSiteFrames, 1, 2, 5, 8}) {
    Probe p;
    p.table = &table;
    p.max = max;
    site_a(p);
    INFO("max_frames " << max);
    CHECK(table.frames(p.id) == p.cold);
    if (max == kMaxCallSiteFrames) {
      deep = p.cold;
      REQUIRE(deep.size() > 8);
      continue;
    }
    REQUIRE(p.cold.size() == static_cast<std::size_t>(max));
    CHECK(std::vector<std::uintptr_t>(deep.begin(), deep.begin() + max) == p.cold);
  }
  Probe none;
  none.table = &table;
  none.max = 0;
  site_a(none);
  CHECK(none.id == 0);
  CHECK(none.cold.empty());
  std::uintptr_t frames[kMaxCallSiteFrames];
  CHECK(capture_frames(frames, -1, 0, 0) == 0);
  CHECK(capture_site(table, -1, 0, 0) == 0);
}

TEST_CASE("call sites: two call sites in a loop keep two ids, each a cold capture's") {
  CallSiteTable table;
  Probe a;
  Probe b;
  a.table = b.table = &table;
  std::uint32_t id_a = 0;
  std::uint32_t id_b = 0;
  const SiteCacheCounts before = site_cache_counts();
  ONE_CALL_SITE
  for (int i = 0; i < 100; ++i) {
    site_a(a);
    site_b(b);
    REQUIRE(a.cold.size() == 8);
    REQUIRE(table.frames(a.id) == a.cold);
    REQUIRE(table.frames(b.id) == b.cold);
    if (i == 0) {
      id_a = a.id;
      id_b = b.id;
    }
    REQUIRE(a.id == id_a);
    REQUIRE(b.id == id_b);
  }
  CHECK(id_a != 0);
  CHECK(id_b != 0);
  CHECK(id_a != id_b);
  const SiteCacheCounts d = since(before);
  CHECK(d.unwinds == 2);
  CHECK(d.hits == 198);
}

TEST_CASE("call sites: the same site through two callers at one depth keeps both apart") {
  CallSiteTable table;
  Probe p1;
  Probe p2;
  p1.table = p2.table = &table;
  outer_1(p1);
  outer_2(p2);
  // The premise: one stack depth, so one key; only the verification tells them apart.
  REQUIRE(p1.mid_frame == p2.mid_frame);
  SECTION("frames past the outer callers: different ids, each verified") {
    p1.max = p2.max = 2;  // [mid, outer_N]: they differ in the last frame checked
    const SiteCacheCounts before = site_cache_counts();
    ONE_CALL_SITE
    for (int i = 0; i < 50; ++i) {
      outer_1(p1);
      outer_2(p2);
      REQUIRE(table.frames(p1.id) == p1.cold);
      REQUIRE(table.frames(p2.id) == p2.cold);
      REQUIRE(p1.id != p2.id);
    }
    const SiteCacheCounts d = since(before);
    CHECK(d.unwinds == 2);
    CHECK(d.hits == 98);
  }
  SECTION("frames inside the callers only: one id, one unwind") {
    p1.max = p2.max = 1;  // [mid]
    const SiteCacheCounts before = site_cache_counts();
    ONE_CALL_SITE
    for (int i = 0; i < 50; ++i) {
      outer_1(p1);
      outer_2(p2);
      REQUIRE(table.frames(p1.id) == p1.cold);
      REQUIRE(p1.id == p2.id);
    }
    const SiteCacheCounts d = since(before);
    CHECK(d.unwinds == 1);
    CHECK(d.hits == 99);
  }
}

namespace {

using RealignCaller = void (*)(Probe&, std::uintptr_t*, bool);
const RealignCaller kRealignCallers[] = {realign_caller_0, realign_caller_1, realign_caller_2,
                                         realign_caller_3};

// The premise of the realignment tests (a review reproduced wrong answers with it): the pairs
// of callers (first, second) for which the realigning frame sits at two addresses while
// everything inside it sits at one; the first caller calls leave_rbp_copy() when asked.
std::vector<std::pair<int, int>> moving_pairs(bool first_leaves_copy) {
  std::vector<std::pair<int, int>> pairs;
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) {
      if (i == j) continue;
      Probe a;
      Probe b;
      std::uintptr_t frame_a = 0;
      std::uintptr_t frame_b = 0;
      kRealignCallers[i](a, &frame_a, first_leaves_copy);
      kRealignCallers[j](b, &frame_b, false);
      if (frame_a != frame_b && a.mid_frame == b.mid_frame) pairs.emplace_back(i, j);
    }
  }
  return pairs;
}

// Alternates the pair's callers `rounds` times through one indirect call instruction (every
// frame outside the callers is shared), checking each answer against a cold capture.
void alternate(CallSiteTable& table, std::pair<int, int> pair, bool first_leaves_copy, int rounds,
               Probe& p1, Probe& p2) {
  p1.table = p2.table = &table;
  p1.max = p2.max = 3;  // [realigned_inner, realigning, the caller]: they differ in the last
  std::uintptr_t frame = 0;
  ONE_CALL_SITE
  for (int n = 0; n < rounds; ++n) {
    for (Probe* p : {&p1, &p2}) {
      kRealignCallers[p == &p1 ? pair.first : pair.second](*p, &frame,
                                                           p == &p1 && first_leaves_copy);
    }
    REQUIRE(table.frames(p1.id) == p1.cold);
    REQUIRE(table.frames(p2.id) == p2.cold);
  }
}

}  // namespace

TEST_CASE("call sites: a frame that realigns its stack cannot pass off its first caller") {
  const auto pairs = moving_pairs(false);
  REQUIRE(!pairs.empty());
  CallSiteTable table;
  Probe p1;
  Probe p2;
  const SiteCacheCounts before = site_cache_counts();
  alternate(table, pairs.front(), false, 50, p1, p2);
  CHECK(p1.id != p2.id);
  // Both chains are kept (the frame pointer's saved copy tells them apart), each unwound once.
  const SiteCacheCounts d = since(before);
  CHECK(d.unwinds == 2);
  CHECK(d.hits == 98);
}

TEST_CASE("call sites: a stale copy of a frame pointer does not pass for the saved one") {
  // The first caller leaves a copy of realigning's future rbp where its alignment gap will be.
  // (One table for all pairs: entries name a table by its address, and a table made anew may
  // take a dead one's.)
  const auto pairs = moving_pairs(true);
  REQUIRE(!pairs.empty());
  CallSiteTable table;
  for (const auto& pair : pairs) {
    Probe p1;
    Probe p2;
    alternate(table, pair, true, 20, p1, p2);
  }
}

TEST_CASE("call sites: one site at several depths, cached per depth") {
  CallSiteTable table;
  const int depths[] = {4, 9, 12, 20};
  std::uint32_t ids[4] = {};
  const SiteCacheCounts before = site_cache_counts();
  ONE_CALL_SITE
  for (int round = 0; round < 10; ++round) {
    ONE_CALL_SITE
    for (int i = 0; i < 4; ++i) {
      Probe p;
      p.table = &table;
      recurse(p, depths[i]);
      REQUIRE(p.cold.size() == 8);
      REQUIRE(table.frames(p.id) == p.cold);
      if (round == 0) ids[i] = p.id;
      REQUIRE(p.id == ids[i]);
    }
  }
  // Eight frames deep, depths 9, 12 and 20 are one chain of recursive calls: one site.
  CHECK(ids[0] != ids[1]);
  CHECK(ids[1] == ids[2]);
  CHECK(ids[2] == ids[3]);
  const SiteCacheCounts d = since(before);
  CHECK(d.unwinds == 4);
  CHECK(d.hits == 36);
}

TEST_CASE("call sites: each thread has its own cache, with its own ids") {
  CallSiteTable table;
  Probe main_probe;
  main_probe.table = &table;
  main_probe.max = kMaxCallSiteFrames;
  const SiteCacheCounts main_before = site_cache_counts();
  ONE_CALL_SITE
  for (int i = 0; i < 3; ++i) site_a(main_probe);
  CHECK(main_probe.cold.size() < kMaxCallSiteFrames);  // the whole stack, to _start
  CHECK(since(main_before).hits == 2);
  std::vector<std::uint32_t> ids;
  std::vector<bool> correct;
  SiteCacheCounts d;
  std::thread t([&] {
    const SiteCacheCounts before = site_cache_counts();
    Probe p;
    p.table = &table;
    p.max = kMaxCallSiteFrames;
    ONE_CALL_SITE
    for (int i = 0; i < 10; ++i) {
      site_a(p);
      ids.push_back(p.id);
      // The whole stack, up to the thread's outermost frame (its undefined return address).
      correct.push_back(!p.cold.empty() && p.cold.size() < kMaxCallSiteFrames &&
                        table.frames(p.id) == p.cold);
    }
    d = since(before);
  });
  t.join();
  REQUIRE(ids.size() == 10);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CHECK(correct[i]);
    CHECK(ids[i] == ids[0]);
  }
  CHECK(ids[0] != main_probe.id);  // its outer frames are the thread's, not the test's
  CHECK(d.unwinds == 1);
  CHECK(d.hits == 9);
}

TEST_CASE("call sites: entries made for one table do not answer for another") {
  CallSiteTable one;
  CallSiteTable two(1024);
  CallSiteTable* const schedule[] = {&one, &one, &one, &two, &one, &two};
  std::vector<std::uint32_t> ids;
  std::vector<SiteCacheCounts> counts;
  Probe p;
  ONE_CALL_SITE
  for (CallSiteTable* table : schedule) {
    p.table = table;
    const SiteCacheCounts before = site_cache_counts();
    site_a(p);
    counts.push_back(since(before));
    ids.push_back(p.id);
    CHECK(table->frames(p.id) == p.cold);
  }
  CHECK(counts[0].unwinds == 1);  // one: filled
  CHECK(counts[1].hits == 1);
  CHECK(counts[2].hits == 1);
  CHECK(counts[3].unwinds == 1);  // two: not answered by one's entry
  CHECK(counts[4].hits == 1);     // one's entry is still there
  CHECK(counts[5].hits == 1);     // and so is two's
  CHECK(ids[4] == ids[0]);
  CHECK(ids[5] == ids[3]);
  CHECK(two.frames(ids[3]) == one.frames(ids[0]));
}

namespace {

Probe* g_foreign_probe = nullptr;
SiteCacheCounts g_foreign_counts;
std::vector<bool> g_foreign_correct;
ucontext_t g_main_context;
ucontext_t g_foreign_context;

void on_foreign_stack() {
  const SiteCacheCounts before = site_cache_counts();
  ONE_CALL_SITE
  for (int i = 0; i < 5; ++i) {
    site_a(*g_foreign_probe);
    g_foreign_correct.push_back(!g_foreign_probe->cold.empty() &&
                                g_foreign_probe->table->frames(g_foreign_probe->id) ==
                                    g_foreign_probe->cold);
  }
  g_foreign_counts = since(before);
}

}  // namespace

TEST_CASE("call sites: on a stack not the thread's, every capture unwinds") {
  CallSiteTable table;
  Probe p;
  p.table = &table;
  g_foreign_probe = &p;
  g_foreign_correct.clear();
  std::vector<char> stack(256 * 1024);
  REQUIRE(getcontext(&g_foreign_context) == 0);
  g_foreign_context.uc_stack.ss_sp = stack.data();
  g_foreign_context.uc_stack.ss_size = stack.size();
  g_foreign_context.uc_link = &g_main_context;
  makecontext(&g_foreign_context, &on_foreign_stack, 0);
  REQUIRE(swapcontext(&g_main_context, &g_foreign_context) == 0);
  REQUIRE(g_foreign_correct.size() == 5);
  for (bool ok : g_foreign_correct) CHECK(ok);
  CHECK(g_foreign_counts.unwinds == 5);
  CHECK(g_foreign_counts.hits == 0);
}

namespace {

Probe* g_signal_probe = nullptr;
// What the handler saw, in fixed storage: a signal handler allocates nothing (ThreadSanitizer
// reports it if it does); the comparison with the table happens after it returned.
struct SignalCapture {
  std::uint32_t id;
  int depth;
  std::uintptr_t cold[kMaxCallSiteFrames];
};
SignalCapture g_signal_captures[3];

void on_signal(int) {
  ONE_CALL_SITE
  for (auto& c : g_signal_captures) {
    site_a(*g_signal_probe);  // p.cold has capacity reserved: assigning it allocates nothing
    c.id = g_signal_probe->id;
    c.depth = static_cast<int>(g_signal_probe->cold.size());
    std::copy(g_signal_probe->cold.begin(), g_signal_probe->cold.end(), c.cold);
  }
}

}  // namespace

TEST_CASE("call sites: a chain through a signal frame is not cached") {
  CallSiteTable table;
  Probe p;
  p.table = &table;
  g_signal_probe = &p;
  struct sigaction action = {};
  struct sigaction old = {};
  action.sa_handler = &on_signal;
  sigemptyset(&action.sa_mask);
  REQUIRE(sigaction(SIGUSR2, &action, &old) == 0);
  p.cold.reserve(kMaxCallSiteFrames);
  auto run = [&](int max) {
    p.max = max;
    for (auto& c : g_signal_captures) c = SignalCapture{};
    const SiteCacheCounts before = site_cache_counts();
    raise(SIGUSR2);
    const SiteCacheCounts counts = since(before);
    for (const auto& c : g_signal_captures) {
      CHECK(c.depth > 0);
      CHECK(table.frames(c.id) == std::vector<std::uintptr_t>(c.cold, c.cold + c.depth));
    }
    CHECK(g_signal_captures[1].id == g_signal_captures[0].id);
    CHECK(g_signal_captures[2].id == g_signal_captures[0].id);
    return counts;
  };
  // All frames: the walk crosses the signal frame, so every capture unwinds.
  const SiteCacheCounts through = run(kMaxCallSiteFrames);
  CHECK(through.unwinds == 3);
  CHECK(through.hits == 0);
  // Two frames (site_a, on_signal): the walk stops inside the handler and is cached.
  const SiteCacheCounts inside = run(2);
  CHECK(inside.unwinds == 1);
  CHECK(inside.hits == 2);
  sigaction(SIGUSR2, &old, nullptr);
}
