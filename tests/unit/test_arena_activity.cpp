// ArenaActivity (issue 13, thread scaling): an arena is idle after a whole period without a
// request, and active again at its next request.
#include <catch2/catch.hpp>

#include "arena_activity.h"

using poolshim::ArenaActivity;

namespace {
constexpr std::uint64_t kPeriod = ArenaActivity::kPeriodNs;
}

TEST_CASE("arena activity: an arena without a request for a whole period turns idle at the tick") {
  ArenaActivity a;
  CHECK_FALSE(a.idle(3));  // nothing has turned yet
  a.note_use(3);
  CHECK(a.tick(1000));                      // the first tick turns at once
  CHECK_FALSE(a.idle(3));                   // used in the period that ended
  CHECK(a.idle(4));                         // never used
  CHECK_FALSE(a.tick(1000 + kPeriod - 1));  // less than a period: nothing turns
  CHECK_FALSE(a.idle(3));
  CHECK(a.tick(1000 + kPeriod));  // a whole period without a request
  CHECK(a.idle(3));
}

TEST_CASE("arena activity: a request makes an idle arena active at once, until a quiet period") {
  ArenaActivity a;
  a.tick(0);
  REQUIRE(a.idle(5));
  a.note_use(5);
  CHECK_FALSE(a.idle(5));
  CHECK(a.idle(6));  // the others stay as they were
  CHECK(a.tick(kPeriod));
  CHECK_FALSE(a.idle(5));  // used in that period
  a.note_use(5);
  CHECK(a.tick(2 * kPeriod));
  CHECK_FALSE(a.idle(5));  // and in this one
  CHECK(a.tick(3 * kPeriod));
  CHECK(a.idle(5));
}
