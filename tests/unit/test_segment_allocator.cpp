// SegmentAllocator (issue 13): exact split, merge and give-back figures, first over a source
// that hands out addresses from a counter, then over the driver double's cudaMemPool.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "counting_source.h"
#include "device_pool.h"
#include "driver_double.h"
#include "pool_segments.h"
#include "segment_allocator.h"

using namespace poolshim;
using poolshim::testing::DriverDouble;
using poolshim::testing::MiB;
using Block = SegmentAllocator::Block;
using poolshim::testing::CountingSource;
using poolshim::testing::take;

namespace {

constexpr std::uint64_t KiB = 1024;

}  // namespace

TEST_CASE("segments: sizes round to 512 bytes, segments by request size") {
  CHECK(SegmentAllocator::rounded(1) == 512);
  CHECK(SegmentAllocator::rounded(512) == 512);
  CHECK(SegmentAllocator::rounded(513) == 1024);
  CHECK(SegmentAllocator::segment_for(1) == 2 * MiB);
  CHECK(SegmentAllocator::segment_for(1 * MiB) == 2 * MiB);
  CHECK(SegmentAllocator::segment_for(1 * MiB + 1) == 20 * MiB);
  CHECK(SegmentAllocator::segment_for(10 * MiB) == 20 * MiB);
  CHECK(SegmentAllocator::segment_for(10 * MiB + 1) == 12 * MiB);
  CHECK(SegmentAllocator::segment_for(100 * MiB + 1) == 102 * MiB);
}

TEST_CASE("segments: a request splits a new segment, the next one the remainder") {
  CountingSource source;
  SegmentAllocator a(source);
  const Block x = take(a, 1000);
  CHECK(x.ptr == 0x10000000);
  CHECK(x.size == 1024);
  const Block y = take(a, 3000);
  CHECK(y.ptr == 0x10000000 + 1024);
  CHECK(y.size == 3072);
  REQUIRE(source.reserved.size() == 1);
  CHECK(source.reserved[0].second == 2 * MiB);
  const auto s = a.stats();
  CHECK(s.reserved == 2 * MiB);
  CHECK(s.allocated == 4096);
  CHECK(s.segments == 1);
  CHECK(s.free_blocks == 1);
  CHECK(s.largest_free == 2 * MiB - 4096);
  CHECK(s.splits == 2);
  CHECK(s.merges == 0);
}

TEST_CASE("segments: a free merges with free neighbours on both sides") {
  CountingSource source;
  SegmentAllocator a(source);
  const Block x = take(a, 4 * KiB);
  const Block y = take(a, 8 * KiB);
  const Block z = take(a, 16 * KiB);
  a.free(x, 0, 0);  // no free neighbour: a block of its own
  CHECK(a.stats().free_blocks == 2);
  CHECK(a.stats().merges == 0);
  a.free(z, 0, 0);  // merges with the segment's tail
  CHECK(a.stats().free_blocks == 2);
  CHECK(a.stats().merges == 1);
  CHECK(a.stats().largest_free == 2 * MiB - 12 * KiB);
  a.free(y, 0, 0);  // between two free blocks: all three are one again
  const auto s = a.stats();
  CHECK(s.free_blocks == 1);
  CHECK(s.merges == 3);
  CHECK(s.largest_free == 2 * MiB);
  CHECK(s.allocated == 0);
  // The whole segment serves again from its start.
  CHECK(take(a, 64 * KiB).ptr == 0x10000000);
  CHECK(source.reserved.size() == 1);
}

TEST_CASE("segments: memory freed at one size serves another") {
  CountingSource source;
  SegmentAllocator a(source);
  std::vector<Block> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(take(a, 100 * KiB));  // 800 KiB of 2 MiB
  for (const Block& b : blocks) a.free(b, 0, 0);
  // Sizes that change from step to step: the same segment, no growth.
  for (std::uint64_t size : {300 * KiB, 700 * KiB, 1 * MiB, KiB + 476, 900 * KiB}) {
    const Block b = take(a, size);
    CHECK(b.ptr == 0x10000000);
    a.free(b, 0, 0);
  }
  CHECK(source.reserved.size() == 1);
  CHECK(a.stats().reserved_peak == 2 * MiB);
  CHECK(a.stats().allocated_peak == 1 * MiB);
}

TEST_CASE("segments: the smallest fitting block of the request's bin, else the next bin's") {
  CountingSource source;
  SegmentAllocator a(source);
  // Free blocks of 9216, 8704 and 6144 bytes, kept apart by blocks in use.
  std::vector<Block> sep;
  const Block big = take(a, 9216);
  sep.push_back(take(a, 512));
  const Block mid = take(a, 8704);
  sep.push_back(take(a, 512));
  const Block small = take(a, 6144);
  sep.push_back(take(a, 512));
  a.free(big, 0, 0);
  a.free(mid, 0, 0);
  a.free(small, 0, 0);
  // 8704 and 9216 share a bin (8 KiB-9 KiB): 8600 takes the smaller, 8704.
  CHECK(take(a, 8600).ptr == mid.ptr);
  // 5000 (5120 after rounding) has an empty bin: the next non-empty one holds 6144.
  CHECK(take(a, 5000).ptr == small.ptr);
  // Left free: the 9216 block, the 1024 bytes split off the 6144 one, and the tail.
  CHECK(a.stats().free_blocks == 3);
}

TEST_CASE("segments: large requests come from 20 MiB segments, split only above 1 MiB") {
  CountingSource source;
  SegmentAllocator a(source);
  const Block x = take(a, 3 * MiB);
  REQUIRE(source.reserved.size() == 1);
  CHECK(source.reserved[0].second == 20 * MiB);
  const Block y = take(a, 3 * MiB + 512 * KiB);
  CHECK(y.ptr == x.ptr + 3 * MiB);
  // 13.5 MiB are left: a 12 MiB request fits (over 10 MiB, but a free block comes first),
  // and its 1.5 MiB remainder is split off.
  const Block z = take(a, 12 * MiB);
  CHECK(z.ptr == y.ptr + 3 * MiB + 512 * KiB);
  CHECK(z.size == 12 * MiB);
  CHECK(source.reserved.size() == 1);
  CHECK(a.stats().largest_free == 1 * MiB + 512 * KiB);
  // A remainder under 1 MiB stays with the block: 1.25 MiB takes all 1.5 MiB.
  const Block w = take(a, 1 * MiB + 256 * KiB);
  CHECK(w.size == 1 * MiB + 512 * KiB);
  CHECK(a.stats().allocated == 20 * MiB);
  // Over 10 MiB with nothing free: a segment of its own, rounded to 2 MiB.
  const Block v = take(a, 11 * MiB);
  REQUIRE(source.reserved.size() == 2);
  CHECK(source.reserved[1].second == 12 * MiB);
  CHECK(v.size == 11 * MiB);
}

TEST_CASE("segments: small and large requests never share a segment") {
  CountingSource source;
  SegmentAllocator a(source);
  a.free(take(a, 4 * MiB), 0, 0);  // a free 20 MiB segment
  const Block s = take(a, 64 * KiB);
  REQUIRE(source.reserved.size() == 2);
  CHECK(source.reserved[1].second == 2 * MiB);
  CHECK(s.ptr == source.reserved[1].first);
}

TEST_CASE("segments: a freed block serves its own stream at once, others after its fence") {
  CountingSource source;
  SegmentAllocator a(source);
  const std::uintptr_t s1 = 0x51;
  const std::uintptr_t s2 = 0x52;
  const Block y = take(a, 256 * KiB);
  const Block pad = take(a, 256 * KiB);
  a.free(y, s1, 5);  // work queued on s1 may use it until fence 5 completes
  Block b;
  // Another stream, fence 5 not complete: the segment's tail, after `pad`.
  REQUIRE(a.allocate(256 * KiB, s2, 4, &b));
  CHECK(b.ptr == pad.ptr + 256 * KiB);
  // s2's block and the ready tail after it have different tokens: they stay apart, so that the
  // tail stays ready for every stream.
  a.free(b, s2, 6, 4);
  CHECK(a.stats().merges == 0);
  // The same stream: at once, with no fence.
  REQUIRE(a.allocate_from_free(256 * KiB, s1, 0, &b));
  CHECK(b.ptr == y.ptr);
  a.free(b, s1, 7, 0);
  // A third stream before fence 6: the tail after s2's block; at fence 6 s2's block too, then
  // (fence 7) y as well.
  REQUIRE(a.allocate_from_free(200 * KiB, 0x53, 5, &b));
  CHECK(b.ptr == pad.ptr + 512 * KiB);
  Block c;
  REQUIRE(a.allocate_from_free(200 * KiB, 0x53, 6, &c));
  CHECK(c.ptr == pad.ptr + 256 * KiB);
  Block e;
  REQUIRE(a.allocate_from_free(200 * KiB, 0x53, 7, &e));
  CHECK(e.ptr == y.ptr);
  CHECK(source.reserved.size() == 1);
}

TEST_CASE(
    "segments: neighbours freed for different streams stay apart until both are ready, then "
    "coalesce merges them") {
  CountingSource source;
  SegmentAllocator a(source);
  const std::uintptr_t s1 = 0x51;
  const std::uintptr_t s2 = 0x52;
  const Block x = take(a, 64 * KiB);
  const Block y = take(a, 64 * KiB);
  const Block guard = take(a, 64 * KiB);
  a.free(x, s1, 3, 0);
  a.free(y, s2, 4, 0);  // neither stream's order covers both: not merged with x
  CHECK(a.stats().merges == 0);
  CHECK(a.stats().free_blocks == 3);  // x, y and the segment's tail
  Block b;
  // s1 at fence 3: x is too small, y may still be in use on s2: the segment's tail.
  REQUIRE(a.allocate_from_free(128 * KiB, s1, 3, &b));
  CHECK(b.ptr == guard.ptr + 64 * KiB);
  a.free(b, 0, 0, 3);  // ready, next to the ready tail: merged
  CHECK(a.stats().merges == 1);
  // Fence 4 done: both ready, but nothing merged them yet; coalesce does, into one 128 KiB.
  CHECK(a.coalesce(3) == 0);  // y is not ready before fence 4
  CHECK(a.coalesce(4) == 1);
  REQUIRE(a.allocate_from_free(128 * KiB, s2, 4, &b));
  CHECK(b.ptr == x.ptr);
  CHECK(b.size == 128 * KiB);
  CHECK(a.stats().merges == 2);
}

TEST_CASE("segments: a stream's frees merge with the rest of a segment that stream made") {
  CountingSource source;
  SegmentAllocator a(source);
  const std::uintptr_t s1 = 0x51;
  Block x;
  REQUIRE(a.allocate(64 * KiB, s1, 0, &x));  // a new segment: its rest carries s1's token
  a.free(x, s1, 9, 0);  // fence 9 not complete, but the same token: one block again
  const auto st = a.stats();
  CHECK(st.merges == 1);
  CHECK(st.free_blocks == 1);
  CHECK(st.largest_free == 2 * MiB);
  Block b;
  REQUIRE(a.allocate_from_free(1 * MiB, s1, 0, &b));  // s1 takes the merged block at once
  CHECK(b.ptr == x.ptr);
  a.free(b, s1, 10, 0);
  CHECK_FALSE(a.allocate_from_free(4 * KiB, 0x52, 9, &b));  // another stream waits for fence 10
  CHECK(a.allocate_from_free(4 * KiB, 0x52, 10, &b));
}

TEST_CASE("segments: when a shared segment does not fit, one of the request's own size does") {
  CountingSource source;
  source.budget = 8 * MiB;
  SegmentAllocator a(source);
  Block b;
  REQUIRE(a.allocate(3 * MiB, 0, 0, &b));  // 20 MiB refused: a 4 MiB segment
  REQUIRE(source.reserved.size() == 1);
  CHECK(source.reserved[0].second == 4 * MiB);
  CHECK(b.size == 3 * MiB);  // the 1 MiB rest is split off (the large arena's minimum)
  CHECK(a.stats().reserved == 4 * MiB);
  CHECK(a.stats().largest_free == 1 * MiB);
}

TEST_CASE("segments: a destroyed stream's blocks wait for their fence") {
  CountingSource source;
  SegmentAllocator a(source);
  const std::uintptr_t s1 = 0x51;
  const Block x = take(a, 64 * KiB);
  const Block guard = take(a, 64 * KiB);
  a.free(x, s1, 9);
  a.forget_affinity(s1);  // a new stream may get s1's handle
  Block b;
  REQUIRE(a.allocate_from_free(64 * KiB, s1, 8, &b));
  CHECK(b.ptr == guard.ptr + 64 * KiB);  // the segment's tail, not x
  a.free(b, 0, 0);
  REQUIRE(a.allocate_from_free(64 * KiB, s1, 9, &b));
  CHECK(b.ptr == x.ptr);
}

TEST_CASE("segments: whole free segments go back, largest first, down to what is kept") {
  CountingSource source;
  SegmentAllocator a(source);
  const Block big = take(a, 30 * MiB);    // a 30 MiB segment
  const Block large = take(a, 5 * MiB);   // a 20 MiB segment
  const Block small = take(a, 10 * KiB);  // a 2 MiB segment
  const Block held = take(a, 10 * KiB);   // same small segment, stays in use
  a.free(big, 0, 2);
  a.free(large, 0, 0);
  a.free(small, 0, 0);
  CHECK(a.stats().reserved == 52 * MiB);
  // Fence 2 has not completed: the 30 MiB segment may still be in use; the small one holds a
  // live block. Only the 20 MiB one goes.
  CHECK(a.trim(0, 1) == 20 * MiB);
  REQUIRE(source.released.size() == 1);
  CHECK(source.released[0].second == 20 * MiB);
  // Keeping 40 MiB: after the 30 MiB one (fence 2 done) 2 MiB are left, nothing more needed.
  CHECK(a.trim(40 * MiB, 2) == 0);
  CHECK(a.trim(2 * MiB, 2) == 30 * MiB);
  CHECK(a.stats().reserved == 2 * MiB);
  a.free(held, 0, 0);
  CHECK(a.trim(0, 2) == 2 * MiB);
  const auto s = a.stats();
  CHECK(s.reserved == 0);
  CHECK(s.segments == 0);
  CHECK(s.free_blocks == 0);
  CHECK(s.segments_reserved == 3);
  CHECK(s.segments_released == 3);
  CHECK(s.reserved_peak == 52 * MiB);
}

TEST_CASE("segments: when the source refuses, nothing changes") {
  CountingSource source;
  source.budget = 2 * MiB;
  SegmentAllocator a(source);
  const Block x = take(a, 1 * MiB);
  Block b;
  CHECK_FALSE(a.allocate(2 * MiB, 0, 0, &b));  // needs a 20 MiB segment
  const auto s = a.stats();
  CHECK(s.reserved == 2 * MiB);
  CHECK(s.allocated == 1 * MiB);
  CHECK(s.segments == 1);
  a.free(x, 0, 0);
  CHECK(a.allocate(2 * KiB, 0, 0, &b));  // the free segment still serves
}

TEST_CASE("segments: thousands of mixed frees and allocations end where they began") {
  CountingSource source;
  SegmentAllocator a(source);
  std::vector<Block> live;
  std::uint64_t seed = 42;
  auto next = [&] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return seed >> 33;
  };
  std::uint64_t expected = 0;
  for (int i = 0; i < 20000; ++i) {
    if (!live.empty() && next() % 2 == 0) {
      const std::size_t k = next() % live.size();
      expected -= live[k].size;
      a.free(live[k], 0, 0);
      live[k] = live.back();
      live.pop_back();
    } else {
      const std::uint64_t size = 256 + next() % (3 * MiB);
      live.push_back(take(a, size));
      expected += live.back().size;
      // At most the granule's rounding, or a remainder under 1 MiB left with a large block.
      CHECK(live.back().size >= SegmentAllocator::rounded(size));
      CHECK(live.back().size - SegmentAllocator::rounded(size) < 1 * MiB);
    }
    if (i % 1000 == 0) REQUIRE(a.stats().allocated == expected);
  }
  // No two live blocks overlap.
  std::vector<std::pair<CUdeviceptr, std::uint64_t>> spans;
  for (const Block& b : live) spans.emplace_back(b.ptr, b.size);
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) {
    REQUIRE(spans[i - 1].first + spans[i - 1].second <= spans[i].first);
  }
  for (const Block& b : live) a.free(b, 0, 0);
  const auto s = a.stats();
  CHECK(s.allocated == 0);
  CHECK(s.free_blocks == s.segments);  // every segment merged back into one block
  CHECK(a.trim(0, 0) == s.reserved);
  CHECK(a.stats().reserved == 0);
}

// ---- over the driver double's cudaMemPool ---------------------------------------------------

TEST_CASE("segments: over the double's pool, segments are what the pool reserves and uses") {
  DriverDouble d(1, 256 * MiB);
  d.make_current(0);
  std::string error;
  PoolSettings settings;
  auto pool = DevicePool::create(d.api, 0, settings, &error);
  REQUIRE(pool != nullptr);
  DevicePoolSegments source(d.api, *pool);
  SegmentAllocator a(source);
  const Block x = take(a, 1000);
  const Block y = take(a, 3 * MiB);
  const Block z = take(a, 700 * KiB);
  CHECK(z.ptr == x.ptr + 1024);  // the small segment's remainder
  PoolUsage u = pool->usage();
  CHECK(u.used == 22 * MiB);  // a 2 MiB and a 20 MiB segment
  CHECK(u.reserved == 22 * MiB);
  CHECK(a.stats().allocated == 1024 + 3 * MiB + 700 * KiB);
  a.free(x, 0, 0);
  a.free(z, 0, 0);
  CHECK(a.trim(0, 0) == 2 * MiB);  // the small segment is whole again; the large holds y
  u = pool->usage();
  CHECK(u.used == 20 * MiB);
  a.free(y, 0, 0);
  CHECK(a.trim(0, 0) == 20 * MiB);
  CHECK(pool->usage().used == 0);
  pool->trim_to(0);
  CHECK(pool->usage().reserved == 0);
}
