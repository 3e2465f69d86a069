// PageMap (issue 13's paged large arenas): exact map, claim, unmap and give-back figures over a
// physical memory that records its calls.
#include <catch2/catch.hpp>

#include "counting_source.h"
#include "page_map.h"

using namespace poolshim;
using poolshim::testing::CountingPhysical;

namespace {

constexpr std::uint64_t MiB = 1ULL << 20;
constexpr std::uint64_t kPage = 8 * MiB;

}  // namespace

TEST_CASE("pages: the range is reserved once, rounded up to whole pages") {
  CountingPhysical physical;
  PageMap pages(physical, kPage, 60 * MiB);
  CHECK(pages.span() == 64 * MiB);
  REQUIRE(pages.reserve() == CUDA_SUCCESS);
  REQUIRE(pages.reserve() == CUDA_SUCCESS);
  REQUIRE(physical.reserved.size() == 1);
  CHECK(physical.reserved[0].second == 64 * MiB);
  CHECK(pages.base() == physical.reserved[0].first);
  CHECK(pages.contains(pages.base() + 64 * MiB - 1));
  CHECK_FALSE(pages.contains(pages.base() + 64 * MiB));
}

TEST_CASE("pages: a commit maps each page under the range once, with new memory") {
  CountingPhysical physical;
  PageMap pages(physical, kPage, 64 * MiB);
  REQUIRE(pages.reserve() == CUDA_SUCCESS);
  const CUdeviceptr base = pages.base();
  CHECK_FALSE(pages.mapped(base + MiB, 10 * MiB));
  CHECK(pages.unmapped_bytes(base + MiB, 10 * MiB) == 16 * MiB);  // pages 0 and 1
  {
    std::lock_guard<std::mutex> lock(pages.mutex());
    REQUIRE(pages.commit(base + MiB, 10 * MiB) == CUDA_SUCCESS);
    REQUIRE(pages.commit(base + 2 * MiB, 14 * MiB) == CUDA_SUCCESS);  // the same two pages
  }
  CHECK(pages.mapped(base, 16 * MiB));
  CHECK_FALSE(pages.mapped(base + 16 * MiB, 1));
  CHECK(pages.unmapped_bytes(base, 24 * MiB) == 8 * MiB);
  CHECK(pages.mapped_bytes() == 16 * MiB);
  REQUIRE(physical.maps.size() == 2);
  CHECK(physical.maps[0].first == base);
  CHECK(physical.maps[1].first == base + kPage);
  CHECK(physical.created.size() == 2);
  const PageMap::Stats s = pages.stats();
  CHECK(s.maps == 2);
  CHECK(s.creates == 2);
  CHECK(s.mapped_peak == 16 * MiB);
}

TEST_CASE("pages: only pages wholly inside a claimed range go, highest first, and map again") {
  CountingPhysical physical;
  PageMap pages(physical, kPage, 64 * MiB);
  REQUIRE(pages.reserve() == CUDA_SUCCESS);
  const CUdeviceptr base = pages.base();
  std::lock_guard<std::mutex> lock(pages.mutex());
  REQUIRE(pages.commit(base, 32 * MiB) == CUDA_SUCCESS);  // pages 0-3, handles 1-4
  // [1, 31) MiB holds pages 1 and 2 wholly; 8 MiB wanted: the higher one, page 2.
  CHECK(pages.claim(base + MiB, 30 * MiB, 8 * MiB) == 8 * MiB);
  CHECK_FALSE(pages.mapped(base + 16 * MiB, 1));  // claimed: an allocation there commits it
  CHECK(physical.unmaps.empty());                 // not unmapped yet
  CHECK(pages.claim(base + MiB, 30 * MiB, ~0ULL) == 8 * MiB);  // page 1; page 2 is claimed
  pages.unmap_claimed();
  REQUIRE(physical.unmaps.size() == 2);
  CHECK(physical.unmaps[0] == base + 16 * MiB);
  CHECK(physical.unmaps[1] == base + 8 * MiB);
  CHECK(pages.mapped_bytes() == 16 * MiB);
  CHECK(pages.mapped(base, 8 * MiB));
  CHECK(pages.mapped(base + 24 * MiB, 8 * MiB));
  // The claimed memory maps where the next commit needs it, without new memory.
  REQUIRE(pages.commit(base + 40 * MiB, 16 * MiB) == CUDA_SUCCESS);  // pages 5 and 6
  CHECK(physical.created.size() == 4);
  REQUIRE(physical.maps.size() == 6);
  CHECK(physical.maps[4] == std::make_pair(base + 40 * MiB, CUmemGenericAllocationHandle{2}));
  CHECK(physical.maps[5] == std::make_pair(base + 48 * MiB, CUmemGenericAllocationHandle{3}));
  CHECK(pages.mapped_bytes() == 32 * MiB);
}

TEST_CASE("pages: spare memory a commit did not use is destroyed") {
  CountingPhysical physical;
  PageMap pages(physical, kPage, 64 * MiB);
  REQUIRE(pages.reserve() == CUDA_SUCCESS);
  std::lock_guard<std::mutex> lock(pages.mutex());
  REQUIRE(pages.commit(pages.base(), 24 * MiB) == CUDA_SUCCESS);
  CHECK(pages.claim(pages.base(), 24 * MiB, ~0ULL) == 24 * MiB);
  pages.unmap_claimed();
  REQUIRE(pages.commit(pages.base() + 32 * MiB, 8 * MiB) == CUDA_SUCCESS);  // uses one
  CHECK(physical.held == 24 * MiB);
  CHECK(pages.held_bytes() == 24 * MiB);  // 8 mapped, 16 spare
  CHECK(pages.mapped_bytes() == 8 * MiB);
  pages.drop_spare();
  CHECK(physical.held == 8 * MiB);
  CHECK(pages.held_bytes() == 8 * MiB);
  CHECK(physical.destroyed.size() == 2);
}

TEST_CASE("pages: out of memory undoes the commit's own mappings and answers the error") {
  CountingPhysical physical;
  physical.budget = 24 * MiB;
  PageMap pages(physical, kPage, 64 * MiB);
  REQUIRE(pages.reserve() == CUDA_SUCCESS);
  const CUdeviceptr base = pages.base();
  std::lock_guard<std::mutex> lock(pages.mutex());
  REQUIRE(pages.commit(base + 8 * MiB, 8 * MiB) == CUDA_SUCCESS);  // page 1, before
  // Pages 0-3: 0 and 2 are made and mapped, 3 is not (the budget is gone); 1 stays.
  CHECK(pages.commit(base, 32 * MiB) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(pages.mapped_bytes() == 8 * MiB);
  CHECK(pages.mapped(base + 8 * MiB, 8 * MiB));
  CHECK_FALSE(pages.mapped(base, 1));
  CHECK_FALSE(pages.mapped(base + 16 * MiB, 1));
  REQUIRE(physical.unmaps.size() == 2);
  CHECK(physical.unmaps[0] == base);
  CHECK(physical.unmaps[1] == base + 16 * MiB);
  // Their memory is spare until dropped: held, as the device counts it.
  CHECK(pages.held_bytes() == 24 * MiB);
  pages.drop_spare();
  CHECK(pages.held_bytes() == 8 * MiB);
  CHECK(physical.held == 8 * MiB);
  CHECK(pages.held_peak() == 24 * MiB);
}

TEST_CASE("pages: release unmaps and destroys every page and gives the addresses back") {
  CountingPhysical physical;
  PageMap pages(physical, kPage, 64 * MiB);
  REQUIRE(pages.reserve() == CUDA_SUCCESS);
  const CUdeviceptr base = pages.base();
  {
    std::lock_guard<std::mutex> lock(pages.mutex());
    REQUIRE(pages.commit(base + 8 * MiB, 16 * MiB) == CUDA_SUCCESS);
  }
  pages.release();
  CHECK(physical.unmaps.size() == 2);
  CHECK(physical.destroyed.size() == 2);
  CHECK(physical.held == 0);
  REQUIRE(physical.unreserved.size() == 1);
  CHECK(physical.unreserved[0] == std::make_pair(base, 64 * MiB));
  CHECK(pages.mapped_bytes() == 0);
  // A later reserve() reserves anew.
  REQUIRE(pages.reserve() == CUDA_SUCCESS);
  CHECK(physical.reserved.size() == 2);
}

TEST_CASE("pages: handles lists the memory under a range page by page, none when one is unmapped") {
  CountingPhysical physical;
  PageMap pages(physical, kPage, 64 * MiB);
  REQUIRE(pages.reserve() == CUDA_SUCCESS);
  const CUdeviceptr base = pages.base();
  {
    std::lock_guard<std::mutex> lock(pages.mutex());
    REQUIRE(pages.commit(base, 24 * MiB) == CUDA_SUCCESS);  // pages 0-2, handles 1-3
  }
  CUmemGenericAllocationHandle out[4] = {};
  // [7, 17) MiB lies on pages 0, 1 and 2.
  REQUIRE(pages.handles(base + 7 * MiB, 10 * MiB, out, 4) == 3);
  CHECK(out[0] == 1);
  CHECK(out[1] == 2);
  CHECK(out[2] == 3);
  CHECK(pages.handles(base + 8 * MiB, 8 * MiB, out, 4) == 1);  // page 1 alone
  CHECK(out[0] == 2);
  CHECK(pages.handles(base + 7 * MiB, 10 * MiB, out, 2) == 0);  // more pages than room
  CHECK(pages.handles(base + 16 * MiB, 9 * MiB, out, 4) == 0);  // page 3 is not mapped
  CHECK(pages.handles(base + 60 * MiB, 8 * MiB, out, 4) == 0);  // past the range
  CHECK(pages.handles(base, 0, out, 4) == 0);
}
