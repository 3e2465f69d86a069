// Gauges (DESIGN §5, issue 13's thread scaling): per-shard parts published to a shared sum in
// batches; exact current values, and peaks exact for one shard and bounded for many.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "stats.h"

using namespace poolshim;

namespace {
constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;
}  // namespace

TEST_CASE("gauge: one thread's changes give the exact current value and peak") {
  DeviceStats s;
  s.on_alloc(12 * MiB);
  CHECK(s.requested_bytes.sum.load() == 0);  // below the 16 MiB batch: nothing shared written
  s.on_alloc(5 * MiB);
  CHECK(s.requested_bytes.sum.load() == 17 * MiB);  // the batch reached: published
  s.on_free(12 * MiB);
  s.on_alloc(3 * MiB);
  const StatsSnapshot snap = take_snapshot(s);
  CHECK(s.requested_bytes.sum.load() == 17 * MiB);  // 9 MiB under it: not yet published
  CHECK(snap.requested_bytes.current == 8 * MiB);
  CHECK(snap.requested_bytes.peak == 17 * MiB);
  CHECK(snap.requested_bytes.total == 20 * MiB);
  CHECK(snap.live_allocs.current == 2);
  CHECK(snap.live_allocs.peak == 2);
  CHECK(snap.live_allocs.total == 3);
}

TEST_CASE(
    "gauge: unpublished changes of other shards bound the peak's error, a snapshot raises it to "
    "the exact current value") {
  Gauge g(100);
  GaugePart a;
  GaugePart b;
  g.add(a, 90);
  g.add(b, 90);                // the truth is 180; b sees only its own 90
  CHECK(g.peak.load() == 90);  // within (2 - 1) x 100 of it
  g.add(b, 20);                // b reaches its batch: publishes 110
  CHECK(g.sum.load() == 110);
  CHECK(g.peak.load() == 110);
  DeviceStats s;
  s.requested_bytes.add(s.shards[2].requested_bytes_part, 90 * KiB);
  s.requested_bytes.add(s.shards[5].requested_bytes_part, 90 * KiB);
  CHECK(s.requested_bytes.peak.load() == 90 * KiB);
  const StatsSnapshot snap = take_snapshot(s);
  CHECK(snap.requested_bytes.current == 180 * KiB);
  CHECK(snap.requested_bytes.peak == 180 * KiB);
}

TEST_CASE("gauge: a free counted on a shard read before its allocation's never wraps") {
  DeviceStats s;
  s.requested_bytes.add(s.shards[0].requested_bytes_part, -4096);  // the free, on shard 0
  CHECK(take_snapshot(s).requested_bytes.current == 0);
  s.requested_bytes.add(s.shards[1].requested_bytes_part, 8192);
  CHECK(take_snapshot(s).requested_bytes.current == 4096);
}

TEST_CASE("gauge: threads that allocate and free concurrently leave the exact current value") {
  DeviceStats s;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&s, t] {
      for (int i = 0; i < 5000; ++i) {
        const std::uint64_t bytes = 256 + 4096 * static_cast<std::uint64_t>((i * 7 + t) % 300);
        s.on_alloc(bytes);
        s.on_free(bytes);
      }
      s.on_alloc(1000 + static_cast<std::uint64_t>(t));  // each thread leaves one live
    });
  }
  for (auto& t : threads) t.join();
  const StatsSnapshot snap = take_snapshot(s);
  CHECK(snap.requested_bytes.current == 8 * 1000 + 28);
  CHECK(snap.live_allocs.current == 8);
  CHECK(snap.live_allocs.total == 8 * 5001);
  CHECK(snap.requested_bytes.peak >= snap.requested_bytes.current);
}
