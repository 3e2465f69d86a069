// SegmentAllocator's paged large arena (issue 13, DESIGN §7): exact placement, map, move and
// give-back figures over a page map whose physical memory records its calls (8 MiB pages, no
// slack unless a case says so).
#include <catch2/catch.hpp>

#include "counting_source.h"
#include "page_map.h"
#include "segment_allocator.h"
#include "shared_slack.h"

using namespace poolshim;
using poolshim::testing::CountingPhysical;
using poolshim::testing::CountingSource;
using poolshim::testing::take;
using Block = SegmentAllocator::Block;

namespace {

constexpr std::uint64_t MiB = 1ULL << 20;
constexpr std::uint64_t kPage = 8 * MiB;
constexpr std::uint64_t kSpan = 256 * MiB;

}  // namespace

TEST_CASE("paged: large blocks lie in the range, only the pages under them mapped") {
  CountingSource source;
  CountingPhysical physical;
  PageMap pages(physical, kPage, kSpan);
  SegmentAllocator a(source, &pages, 0);
  const Block x = take(a, 12 * MiB);
  CHECK(x.ptr == pages.base());
  CHECK(x.size == 12 * MiB);
  CHECK(pages.mapped_bytes() == 16 * MiB);  // pages 0 and 1
  const Block y = take(a, 4 * MiB);         // [12, 16) MiB: page 1, already mapped
  CHECK(y.ptr == pages.base() + 12 * MiB);
  CHECK(physical.maps.size() == 2);
  CHECK(source.reserved.empty());  // no segment from the pool
  auto s = a.stats();
  CHECK(s.reserved == 16 * MiB);  // the held pages, not the range
  CHECK(s.allocated == 16 * MiB);
  CHECK(a.free_bytes() == 0);
  // Small requests still come from 2 MiB segments of the source.
  const Block small = take(a, 4096);
  REQUIRE(source.reserved.size() == 1);
  CHECK(source.reserved[0].second == 2 * MiB);
  CHECK(a.stats().reserved == 18 * MiB);
  // A freed block's mapped pages serve the next request at once, without a mapping.
  a.free(x, 0, 0);
  CHECK(a.free_bytes() == 12 * MiB + (2 * MiB - 4096));
  const Block z = take(a, 10 * MiB);
  CHECK(z.ptr == pages.base());
  CHECK(physical.maps.size() == 2);
  a.free(small, 0, 0);
  a.free(y, 0, 0);
  a.free(z, 0, 0);
  s = a.stats();
  CHECK(s.allocated == 0);
  CHECK(s.reserved == 18 * MiB);  // kept mapped: the slack is the caller's (trim)
}

TEST_CASE("paged: past the slack a request moves free pages instead of making new ones") {
  CountingSource source;
  CountingPhysical physical;
  PageMap pages(physical, kPage, kSpan);
  SegmentAllocator a(source, &pages, 0);
  const Block x = take(a, 16 * MiB);      // pages 0-1
  const Block y = take(a, 8 * MiB);       // page 2
  const CUdeviceptr base = pages.base();  // reserved at the first large request
  a.free(x, 0, 0);
  // 24 MiB do not fit in x's 16: [24, 48) MiB, pages 3-5. 24 MiB missing, 16 mapped and free:
  // with no slack, x's two pages (highest first) move there, and one page is new.
  const Block z = take(a, 24 * MiB);
  CHECK(z.ptr == base + 24 * MiB);
  REQUIRE(physical.unmaps.size() == 2);
  CHECK(physical.unmaps[0] == base + 8 * MiB);
  CHECK(physical.unmaps[1] == base);
  CHECK(physical.created.size() == 4);
  CHECK(physical.destroyed.empty());
  CHECK(pages.mapped_bytes() == 32 * MiB);
  CHECK(physical.held == 32 * MiB);
  CHECK(a.stats().reserved == 32 * MiB);
  CHECK(a.stats().allocated == 32 * MiB);
  // x's addresses are unmapped now: a request there maps them again.
  CHECK_FALSE(pages.mapped(base, 1));
  const Block w = take(a, 16 * MiB);
  CHECK(w.ptr == base);
  CHECK(pages.mapped_bytes() == 48 * MiB);
  a.free(y, 0, 0);
  a.free(z, 0, 0);
  a.free(w, 0, 0);
}

TEST_CASE("paged: the slack keeps free pages mapped up to its size") {
  CountingSource source;
  CountingPhysical physical;
  PageMap pages(physical, kPage, kSpan);
  SegmentAllocator a(source, &pages, 8 * MiB);
  const Block x = take(a, 16 * MiB);
  const Block y = take(a, 8 * MiB);
  a.free(x, 0, 0);
  // 24 MiB missing, 24 mapped, 32 in use after it: 48 > 32 + 8 by 8 MiB, one page moves.
  const Block z = take(a, 24 * MiB);
  REQUIRE(physical.unmaps.size() == 1);
  CHECK(physical.unmaps[0] == pages.base() + 8 * MiB);
  CHECK(pages.mapped_bytes() == 40 * MiB);
  CHECK(physical.created.size() == 5);
  a.free(y, 0, 0);
  a.free(z, 0, 0);
}

namespace {

struct SharedRun {
  std::size_t unmaps = 0;
  std::uint64_t mapped = 0;
  std::uint64_t excess = 0;
};

// Arenas a and b share an 8 MiB slack; a first keeps `a_spare` bytes of free pages mapped, then
// b runs the sequence of "the slack keeps free pages mapped up to its size".
SharedRun run_beside(std::uint64_t a_spare) {
  CountingSource source;
  CountingPhysical physical;
  SharedSlack share(8 * MiB);
  PageMap pages_a(physical, kPage, kSpan);
  PageMap pages_b(physical, kPage, kSpan);
  SegmentAllocator a(source, &pages_a, 0);
  SegmentAllocator b(source, &pages_b, 0);
  a.share_slack(&share, share.join(&a));
  b.share_slack(&share, share.join(&b));
  if (a_spare > 0) a.free(take(a, a_spare), 0, 0);
  const Block x = take(b, 16 * MiB);
  const Block y = take(b, 8 * MiB);
  b.free(x, 0, 0);
  const Block z = take(b, 24 * MiB);  // 24 MiB missing, 24 mapped, 32 in use after it
  SharedRun r{physical.unmaps.size(), pages_b.mapped_bytes(), b.paged_excess()};
  b.free(y, 0, 0);
  b.free(z, 0, 0);
  return r;
}

}  // namespace

TEST_CASE(
    "paged: arenas sharing one slack: free pages another arena keeps mapped use it up, and a "
    "request moves its own pages instead") {
  // a holds nothing spare: b has the whole 8 MiB, one page moves (48 > 32 + 8 by 8 MiB).
  const SharedRun alone = run_beside(0);
  CHECK(alone.unmaps == 1);
  CHECK(alone.mapped == 40 * MiB);
  CHECK(alone.excess == 8 * MiB);
  // a keeps one free page mapped: b's allowance is 0, both of x's pages move (as with no slack).
  const SharedRun beside = run_beside(8 * MiB);
  CHECK(beside.unmaps == 2);
  CHECK(beside.mapped == 32 * MiB);
  CHECK(beside.excess == 0);
}

TEST_CASE(
    "paged: a request takes a free block whose pages are mapped over a better fit whose pages "
    "are not") {
  CountingSource source;
  CountingPhysical physical;
  PageMap pages(physical, kPage, kSpan);
  SegmentAllocator a(source, &pages, 0);
  const Block a1 = take(a, 16 * MiB);  // [0, 16): pages 0-1
  const Block s1 = take(a, 8 * MiB);   // [16, 24): page 2
  const Block a2 = take(a, 24 * MiB);  // [24, 48): pages 3-5
  const Block s2 = take(a, 8 * MiB);   // [48, 56): page 6
  const CUdeviceptr base = pages.base();
  a.free(a1, 0, 0);
  // 24 MiB fit nowhere mapped: [56, 80), pages 7-9; with no slack a1's two pages move there.
  const Block c = take(a, 24 * MiB);
  CHECK(c.ptr == base + 56 * MiB);
  REQUIRE(physical.unmaps.size() == 2);
  CHECK_FALSE(pages.mapped(base, 16 * MiB));
  a.free(a2, 0, 0);  // [24, 48) free, its pages mapped
  const std::size_t maps = physical.maps.size();
  const std::size_t created = physical.created.size();
  // 12 MiB: a1's 16 MiB fit better (an earlier bin than a2's 24) but are unmapped; a2's mapped
  // pages serve, and no page is mapped, moved or made.
  const Block d = take(a, 12 * MiB);
  CHECK(d.ptr == base + 24 * MiB);
  CHECK(physical.maps.size() == maps);
  CHECK(physical.unmaps.size() == 2);
  CHECK(physical.created.size() == created);
  CHECK(pages.mapped_bytes() == 64 * MiB);  // pages 2-9
  CHECK(a.stats().allocated == 52 * MiB);   // s1, s2, c, d
  // The unmapped block still serves when nothing mapped fits: 16 MiB at [0, 16), 12 MiB over
  // the budget; the one page wholly inside a free block (page 5, in a2's rest [36, 48)) moves
  // and one page is made.
  const Block e = take(a, 16 * MiB);
  CHECK(e.ptr == base);
  CHECK(physical.unmaps.size() == 3);
  CHECK(physical.unmaps[2] == base + 40 * MiB);
  CHECK(physical.created.size() == created + 1);
  CHECK(pages.mapped_bytes() == 72 * MiB);
  for (const Block& b : {s1, s2, c, d, e}) a.free(b, 0, 0);
}

TEST_CASE("paged: pages under a block whose fence has not completed never move") {
  CountingSource source;
  CountingPhysical physical;
  PageMap pages(physical, kPage, kSpan);
  SegmentAllocator a(source, &pages, 0);
  const std::uintptr_t s1 = 0x51;
  const Block x = take(a, 16 * MiB);
  const Block y = take(a, 8 * MiB);
  a.free(x, s1, 5);  // work on s1 may use it until fence 5
  const Block z = take(a, 24 * MiB, 0x52, 4);
  CHECK(z.ptr == pages.base() + 24 * MiB);
  CHECK(physical.unmaps.empty());
  CHECK(physical.created.size() == 6);
  CHECK(pages.mapped_bytes() == 48 * MiB);
  // Trimming before fence 5 gives nothing back; after it, x's pages go and are destroyed.
  CHECK(a.trim(0, 4) == 0);
  CHECK(a.trim(0, 5) == 16 * MiB);
  CHECK(physical.destroyed.size() == 2);
  CHECK(physical.held == 32 * MiB);
  CHECK(a.stats().reserved == 32 * MiB);
  // Keeping 24 MiB frees nothing more: every other page lies under a block in use.
  a.free(y, 0, 0);
  CHECK(a.trim(32 * MiB, 5) == 0);
  CHECK(a.trim(24 * MiB, 5) == 8 * MiB);
  CHECK(physical.held == 24 * MiB);
  a.free(z, 0x52, 0, 5);
  CHECK(a.trim(0, 5) == 24 * MiB);
  CHECK(physical.held == 0);
  CHECK(a.stats().reserved == 0);
  // x was left apart (its fence pending at y's free); coalesce() makes the range whole again.
  CHECK(a.stats().free_blocks == 2);
  CHECK(a.coalesce(5) == 1);
  CHECK(a.stats().free_blocks == 1);
}

TEST_CASE("paged: when the device cannot back a request, its own segment serves it, else none") {
  CountingSource source;
  CountingPhysical physical;
  physical.budget = 24 * MiB;
  PageMap pages(physical, kPage, kSpan);
  SegmentAllocator a(source, &pages, 0);
  const Block x = take(a, 12 * MiB);  // pages 0-1
  // [12, 26) MiB needs pages 2 and 3: page 2 is made and mapped, page 3 refused. Page 2 is
  // unmapped and destroyed again, and a segment of the request's own size serves it.
  const Block y = take(a, 14 * MiB);
  REQUIRE(source.reserved.size() == 1);
  CHECK(y.ptr == source.reserved[0].first);
  CHECK(source.reserved[0].second == 14 * MiB);
  REQUIRE(physical.unmaps.size() == 1);
  CHECK(physical.unmaps[0] == pages.base() + 16 * MiB);
  CHECK(physical.destroyed.size() == 1);
  CHECK(pages.mapped_bytes() == 16 * MiB);
  CHECK(physical.held == 16 * MiB);
  auto s = a.stats();
  CHECK(s.reserved == 30 * MiB);
  CHECK(s.allocated == 26 * MiB);
  // The source refuses as well: the answer is the error, and nothing changed.
  source.budget = 0;
  Block b;
  CUresult why = CUDA_SUCCESS;
  CHECK_FALSE(a.allocate(30 * MiB, 0, 0, &b, &why));
  CHECK(why == CUDA_ERROR_OUT_OF_MEMORY);
  s = a.stats();
  CHECK(s.reserved == 30 * MiB);
  CHECK(s.allocated == 26 * MiB);
  CHECK(pages.mapped_bytes() == 16 * MiB);
  CHECK(physical.held == 16 * MiB);
  // The range's free space is whole again: after x's free a 16 MiB request fits at its start.
  a.free(x, 0, 0);
  const Block z = take(a, 16 * MiB);
  CHECK(z.ptr == pages.base());
  a.free(y, 0, 0);
  a.free(z, 0, 0);
}
