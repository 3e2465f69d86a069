// ArenaClaims (issue 13, thread scaling): which arena a thread's named-stream requests use.
#include <catch2/catch.hpp>

#include "arena_claims.h"

using poolshim::ArenaClaims;

TEST_CASE("arena claims: the lowest unheld arena first, arena 0 never") {
  ArenaClaims c(4);  // arenas 1, 2, 3
  CHECK(c.claim() == 1);
  CHECK(c.claim() == 2);
  CHECK(c.claim() == 3);
  CHECK(c.holders(0) == 0);
  CHECK(c.holders(1) == 1);
  c.release(2);
  CHECK(c.holders(2) == 0);
  CHECK(c.claim() == 2);  // a given-back arena is the next claim
}

TEST_CASE("arena claims: with every arena held, the fewest holders share, lowest first") {
  ArenaClaims c(3);  // arenas 1, 2
  CHECK(c.claim() == 1);
  CHECK(c.claim() == 2);
  CHECK(c.claim() == 1);
  CHECK(c.claim() == 2);
  CHECK(c.claim() == 1);
  CHECK(c.holders(1) == 3);
  CHECK(c.holders(2) == 2);
  c.release(1);
  c.release(1);
  CHECK(c.holders(1) == 1);
  CHECK(c.claim() == 1);  // 1 holder against 2
}

TEST_CASE("arena claims: a release without a claim, or out of range, changes nothing") {
  ArenaClaims c(3);
  c.release(1);
  c.release(0);
  c.release(7);
  c.release(-1);
  CHECK(c.holders(1) == 0);
  CHECK(c.holders(7) == 0);
  CHECK(c.claim() == 1);
  CHECK(c.holders(1) == 1);
}

TEST_CASE("arena claims: one arena only (count 1) leaves every request on arena 0") {
  ArenaClaims c(1);
  CHECK(c.claim() == 0);
  CHECK(c.holders(0) == 0);
}
