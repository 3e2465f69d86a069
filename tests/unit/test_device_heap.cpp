// DeviceHeap (issue 13): arena 0 for cudaMalloc, one arena per live thread, taking from arenas
// no other live thread holds before growing, blocks back to the arena that holds them, trims
// across arenas. Exact figures over the counting source.
#include <catch2/catch.hpp>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "counting_source.h"
#include "device_heap.h"

using namespace poolshim;
using poolshim::testing::CountingSource;

namespace {

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;

DeviceHeap::Block take(DeviceHeap& h, std::uint64_t bytes, std::uintptr_t token,
                       std::uint64_t completed = 0) {
  DeviceHeap::Block b;
  if (h.allocate_from_free(bytes, token, completed, &b)) return b;
  CUresult why = CUDA_SUCCESS;
  REQUIRE(h.allocate(bytes, token, completed, &b, &why));
  return b;
}

}  // namespace

TEST_CASE("device heap: cudaMalloc and the legacy stream share arena 0, live threads hold others") {
  CHECK(DeviceHeap::arena_for(0) == 0);
  CHECK(DeviceHeap::arena_for(1) == 0);
  const int mine = DeviceHeap::arena_for(0x7f0000001000);
  CHECK(mine >= 1);
  CHECK(DeviceHeap::arena_for(0x7f0000009000) == mine);  // any named stream of this thread
  // Eight threads alive together hold eight arenas besides this thread's.
  std::vector<int> others(8);
  std::atomic<int> arrived{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&others, &arrived, t] {
      others[t] = DeviceHeap::arena_for(0x7f0000001000);
      arrived.fetch_add(1);
      while (arrived.load() < 8) std::this_thread::yield();
    });
  }
  for (auto& t : threads) t.join();
  std::set<int> distinct(others.begin(), others.end());
  distinct.insert(mine);
  CHECK(distinct.size() == 9);
  CHECK(*distinct.begin() >= 1);
  CHECK(*distinct.rbegin() < DeviceHeap::kArenas);
  // They have exited: their arenas are free to claim again, and a new thread takes the lowest.
  int next = -1;
  std::thread([&next] { next = DeviceHeap::arena_for(0x7f0000001000); }).join();
  int lowest = 1;
  while (lowest == mine) ++lowest;
  CHECK(next == lowest);
}

TEST_CASE("device heap: a new thread takes over an exited thread's arena and its free memory") {
  CountingSource source;
  DeviceHeap h(source);
  DeviceHeap::Block a;
  std::thread([&] {
    a = take(h, 64 * KiB, 0x7f0000001000);
    h.free(a.arena, a.node, a.size, 0x7f0000001000, 0, 0);  // ready for every stream
  }).join();
  DeviceHeap::Block b;
  std::thread([&] { b = take(h, 64 * KiB, 0x7f0000002000); }).join();
  CHECK(b.arena == a.arena);  // the exited thread's claim went to the new thread
  CHECK(b.ptr == a.ptr);
  CHECK(source.reserved.size() == 1);
}

namespace {

// Another thread, alive until finish(), that takes a 64 KiB block on its own stream and frees it
// ready for every stream into its arena; on resume() it makes `request` (its arena is in use
// again). Its results are asserted on the test's thread: Catch2's checks are not thread-safe.
struct LiveOwner {
  DeviceHeap& h;
  std::atomic<int> step{0};
  std::atomic<bool> request_served{true};
  DeviceHeap::Block a;
  std::thread thread;
  LiveOwner(DeviceHeap& heap, std::uint64_t request) : h(heap) {
    thread = std::thread([this, request] {
      const std::uintptr_t s1 = 0x7f0000001000;
      a = take(h, 64 * KiB, s1);
      h.free(a.arena, a.node, a.size, s1, 0, 0);
      advance_to(1);
      wait_for(2);
      DeviceHeap::Block again;
      request_served.store(h.allocate_from_free(request, s1, 0, &again));
      advance_to(3);
      wait_for(4);
    });
    wait_for(1);
  }
  void resume() {
    advance_to(2);
    wait_for(3);
  }
  void finish() {
    if (step.load() < 2) resume();
    advance_to(4);
    thread.join();
  }
  void advance_to(int n) { step.store(n); }
  void wait_for(int n) const {
    while (step.load() != n) std::this_thread::yield();
  }
};

}  // namespace

TEST_CASE("device heap: a live thread's arena lends its free memory only when asked") {
  CountingSource source;
  DeviceHeap h(source);
  LiveOwner owner(h, 4 * MiB);
  const std::uintptr_t s2 = 0x7f0000002000;  // this thread's own arena
  DeviceHeap::Block b;
  CHECK_FALSE(h.allocate_from_free(64 * KiB, s2, 0, &b));
  CHECK_FALSE(h.allocate_from_free(64 * KiB, 0, 0, &b));  // cudaMalloc's request neither
  CHECK(h.free_bytes(s2, DeviceHeap::Lend::unheld) == 0);
  CHECK(h.free_bytes(s2, DeviceHeap::Lend::any) == 2 * MiB);
  REQUIRE(h.allocate_from_free(64 * KiB, s2, 0, &b, DeviceHeap::Lend::any));
  CHECK(b.ptr == owner.a.ptr);
  CHECK(b.arena == owner.a.arena);
  CHECK(b.arena != DeviceHeap::arena_for(s2));
  CHECK(source.reserved.size() == 1);
  owner.finish();
}

TEST_CASE(
    "device heap: a live thread's arena lends to Lend::idle only after a whole period without "
    "a request, and stops at its next request") {
  CountingSource source;
  DeviceHeap h(source);
  LiveOwner owner(h, 4 * MiB);               // its request on resume: too big to serve
  const std::uintptr_t s2 = 0x7f0000002000;  // this thread's own arena
  const std::uint64_t period = ArenaActivity::kPeriodNs;
  DeviceHeap::Block b;
  h.tick(0);  // the owner's requests fell in this period: active
  CHECK(h.free_bytes(s2, DeviceHeap::Lend::idle) == 0);
  CHECK_FALSE(h.allocate_from_free(64 * KiB, s2, 0, &b, DeviceHeap::Lend::idle));
  h.tick(period);  // a whole period without one: idle
  CHECK(h.free_bytes(s2, DeviceHeap::Lend::idle) == 2 * MiB);
  REQUIRE(h.allocate_from_free(64 * KiB, s2, 0, &b, DeviceHeap::Lend::idle));
  CHECK(b.ptr == owner.a.ptr);
  CHECK(b.arena == owner.a.arena);
  h.free(b.arena, b.node, b.size, s2, 0, 0);
  owner.resume();  // a request: its arena is in use again
  CHECK_FALSE(owner.request_served.load());
  CHECK(h.free_bytes(s2, DeviceHeap::Lend::idle) == 0);
  CHECK_FALSE(h.allocate_from_free(64 * KiB, s2, 0, &b, DeviceHeap::Lend::idle));
  CHECK(source.reserved.size() == 1);
  owner.finish();
}

TEST_CASE(
    "device heap: a block freed on one stream serves another after its fence from its own "
    "arena, without growing, and goes back there") {
  CountingSource source;
  DeviceHeap h(source);
  const std::uintptr_t s1 = 0x7f0000001000;  // this thread's arena
  const std::uintptr_t s2 = 0;               // cudaMalloc's: arena 0
  const DeviceHeap::Block a = take(h, 64 * KiB, s1);
  CHECK(a.arena == DeviceHeap::arena_for(s1));
  h.free(a.arena, a.node, a.size, s1, 3, 0);
  DeviceHeap::Block b;
  CHECK_FALSE(h.allocate_from_free(64 * KiB, s2, 2, &b));  // fence 3 not complete
  REQUIRE(h.allocate_from_free(64 * KiB, s2, 3, &b));
  CHECK(b.ptr == a.ptr);
  CHECK(b.arena == a.arena);  // stolen: it stays in s1's arena
  CHECK(source.reserved.size() == 1);
  h.free(b.arena, b.node, b.size, s2, 0, 3);
  CHECK(h.free_bytes() == 2 * MiB);
  CHECK(h.allocated() == 0);
}

TEST_CASE("device heap: ready memory of another arena serves before any arena grows") {
  CountingSource source;
  DeviceHeap h(source);
  const DeviceHeap::Block a = take(h, 4 * KiB, 0x7f0000001000);  // this thread's arena
  const DeviceHeap::Block b = take(h, 4 * KiB, 0);               // arena 0 has nothing yet
  CHECK(source.reserved.size() == 1);
  CHECK(b.arena == a.arena);  // the ready rest of the first segment
  CHECK(b.ptr == a.ptr + 4 * KiB);
  // Once nothing anywhere is usable, the request's own arena grows.
  h.free(a.arena, a.node, a.size, 0x7f0000001000, 5, 0);      // usable by its stream, others at 5
  const DeviceHeap::Block c = take(h, 2 * MiB - 8 * KiB, 0);  // too big for the rest
  CHECK(source.reserved.size() == 2);
  CHECK(c.arena == 0);
  CHECK(h.reserved() == 22 * MiB);  // the small segment and a 20 MiB one for c
  CHECK(h.allocated() == 4 * KiB + (2 * MiB - 8 * KiB));
  const SegmentAllocator::Stats st = h.stats();
  CHECK(st.segments == 2);
  CHECK(st.reserved == 22 * MiB);
}

TEST_CASE("device heap: a trim keeps at most what is asked in all arenas together") {
  CountingSource source;
  DeviceHeap h(source);
  std::vector<DeviceHeap::Block> blocks;
  for (std::uintptr_t s : {std::uintptr_t{0}, std::uintptr_t{0x7f0000001000}}) {
    blocks.push_back(take(h, 12 * MiB, s));  // a 12 MiB segment of its own in each arena
  }
  REQUIRE(blocks[0].arena != blocks[1].arena);
  for (const auto& b : blocks) h.free(b.arena, b.node, b.size, 0, 0, 0);
  CHECK(h.reserved() == 24 * MiB);
  CHECK(h.trim(12 * MiB, 0) == 12 * MiB);
  CHECK(h.reserved() == 12 * MiB);
  CHECK(h.trim(0, 0) == 12 * MiB);
  CHECK(source.released.size() == 2);
  CHECK(h.free_bytes() == 0);
}

TEST_CASE("device heap: threads on their own streams allocate and free concurrently") {
  CountingSource source;
  DeviceHeap h(source);
  std::vector<std::thread> threads;
  std::atomic<int> refused{0};  // Catch2's assertions are not thread-safe: count, assert after join
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h, &refused, t] {
      const std::uintptr_t token = 0x7f0000001000 + 0x1a0 * static_cast<std::uintptr_t>(t);
      for (int i = 0; i < 2000; ++i) {
        DeviceHeap::Block b;
        CUresult why = CUDA_SUCCESS;
        const std::uint64_t bytes = 512 + 4096 * static_cast<std::uint64_t>((i * 7 + t) % 32);
        if (!h.allocate_from_free(bytes, token, 0, &b) && !h.allocate(bytes, token, 0, &b, &why)) {
          refused.fetch_add(1);
          continue;
        }
        h.free(b.arena, b.node, b.size, token, 0, 0);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(refused.load() == 0);
  CHECK(h.allocated() == 0);
  CHECK(h.free_bytes() == h.reserved());
  std::uint64_t reserved = 0;
  for (const auto& r : source.reserved) reserved += r.second;
  CHECK(h.reserved() == reserved);
  CHECK(h.trim(0, 0) == reserved);
  CHECK(source.released.size() == source.reserved.size());
}
