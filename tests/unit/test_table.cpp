#include <catch2/catch.hpp>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "allocation_table.h"

using poolshim::Allocation;
using poolshim::AllocationTable;

namespace {
Allocation make(std::uint64_t bytes, int device) {
  Allocation a;
  a.requested = bytes;
  a.device = device;
  return a;
}
}  // namespace

TEST_CASE("table: insert, find and take a pointer") {
  AllocationTable t;
  t.insert(0x7f0000000200, make(100, 0));
  CHECK(t.size() == 1);
  REQUIRE(t.find(0x7f0000000200));
  CHECK(t.find(0x7f0000000200)->requested == 100);
  const auto a = t.take(0x7f0000000200);
  REQUIRE(a);
  CHECK(a->requested == 100);
  CHECK(t.size() == 0);
  CHECK_FALSE(t.take(0x7f0000000200));
}

TEST_CASE("table: a pointer never inserted is not found") {
  AllocationTable t;
  t.insert(0x1000, make(1, 0));
  CHECK_FALSE(t.find(0x2000));
  CHECK_FALSE(t.take(0x1100));  // interior pointer
  CHECK(t.size() == 1);
}

TEST_CASE("table: grows past its initial capacity and keeps every entry") {
  AllocationTable t;
  constexpr std::uintptr_t kCount = 200000;  // 49 granules: about 4096 entries a shard
  for (std::uintptr_t i = 1; i <= kCount; ++i) t.insert(i << 9, make(i, 0));
  CHECK(t.size() == kCount);
  for (std::uintptr_t i = 1; i <= kCount; i += 997) {
    REQUIRE(t.find(i << 9));
    CHECK(t.find(i << 9)->requested == i);
  }
  for (std::uintptr_t i = 1; i <= kCount; ++i) REQUIRE(t.take(i << 9));
  CHECK(t.size() == 0);
}

TEST_CASE("table: the blocks of one 2 MiB granule share a shard, and granules spread") {
  constexpr std::uintptr_t kBase = 0x7f0000000000;  // 2 MiB aligned
  constexpr std::uintptr_t kGranule = std::uintptr_t{2} << 20;
  const std::size_t first = AllocationTable::shard_index(kBase);
  CHECK(AllocationTable::shard_index(kBase + 512) == first);
  CHECK(AllocationTable::shard_index(kBase + kGranule - 512) == first);
  CHECK(AllocationTable::shard_index(kBase + kGranule) != first);
  // A thread's arena holds a few segments; the 1024 granules of a 2 GiB-aligned range use every
  // shard once, and the first granule of each of 1024 such ranges (a pool's reservations, say)
  // 1024 shards too.
  std::set<std::size_t> all;
  std::set<std::size_t> some;
  for (std::uintptr_t g = 0; g < 1024; ++g) {
    const std::size_t s = AllocationTable::shard_index(kBase + g * kGranule);
    CHECK(s < static_cast<std::size_t>(AllocationTable::kShards));
    all.insert(s);
    some.insert(AllocationTable::shard_index(kBase + (g << 31)));
  }
  CHECK(all.size() == 1024);
  CHECK(some.size() == 1024);
}

TEST_CASE("table: removal keeps colliding entries reachable (backward shift)") {
  AllocationTable t;
  std::vector<std::uintptr_t> keys;
  for (std::uintptr_t i = 1; i <= 5000; ++i) keys.push_back(i * 0x100);
  for (auto k : keys) t.insert(k, make(k, 0));
  for (std::size_t i = 0; i < keys.size(); i += 2) REQUIRE(t.take(keys[i]));
  for (std::size_t i = 1; i < keys.size(); i += 2) REQUIRE(t.find(keys[i]));
  CHECK(t.size() == keys.size() / 2);
}

TEST_CASE("table: drop_device removes exactly that device's entries") {
  AllocationTable t;
  for (std::uintptr_t i = 1; i <= 3000; ++i) t.insert(i << 8, make(i, static_cast<int>(i % 3)));
  std::uint64_t dropped_bytes = 0;
  std::size_t dropped = 0;
  t.drop_device(1, [&](std::uintptr_t, const Allocation& a) {
    CHECK(a.device == 1);
    dropped_bytes += a.requested;
    ++dropped;
  });
  CHECK(dropped == 1000);
  std::uint64_t expect = 0;
  for (std::uintptr_t i = 1; i <= 3000; ++i) {
    if (i % 3 == 1) expect += i;
  }
  CHECK(dropped_bytes == expect);
  CHECK(t.size() == 2000);
  std::size_t seen = 0;
  t.for_each([&](std::uintptr_t, const Allocation& a) {
    CHECK(a.device != 1);
    ++seen;
  });
  CHECK(seen == 2000);
}

TEST_CASE("table: concurrent inserts and takes from 8 threads lose nothing") {
  AllocationTable t;
  std::atomic<std::size_t> taken{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 8; ++th) {
    threads.emplace_back([&, th] {
      for (std::uintptr_t i = 1; i <= 20000; ++i) {
        const std::uintptr_t key = (static_cast<std::uintptr_t>(th) << 40) | (i << 9);
        t.insert(key, make(i, th));
        if (i % 2 == 0) {
          if (t.take(key)) taken.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(taken.load() == 8 * 10000);
  CHECK(t.size() == 8 * 10000);
}

TEST_CASE("table: add_flags marks a live record and leaves absent pointers absent") {
  AllocationTable t;
  Allocation a = make(100, 0);
  a.flags = Allocation::kAsync;
  t.insert(0x3000, a);
  const auto marked = t.add_flags(0x3000, Allocation::kExported);
  REQUIRE(marked);
  CHECK(marked->flags == (Allocation::kAsync | Allocation::kExported));
  CHECK(t.find(0x3000)->flags == (Allocation::kAsync | Allocation::kExported));
  CHECK_FALSE(t.add_flags(0x4000, Allocation::kExported));
  CHECK(t.size() == 1);
  CHECK(t.take(0x3000)->flags == (Allocation::kAsync | Allocation::kExported));
}
