// SharedSlack (issue 13): one budget of mapped free pages for all of a heap's paged arenas; a
// member's allowance is the budget less the other members' excess.
#include <catch2/catch.hpp>

#include <cstdint>

#include "shared_slack.h"

using poolshim::SharedSlack;

namespace {

struct FakeArena {
  std::uint64_t excess = 0;
  std::uint64_t paged_excess() const { return excess; }
};

}  // namespace

TEST_CASE(
    "shared slack: a member's allowance is the budget less the others' excess, never below 0") {
  SharedSlack share(64);
  FakeArena a{10};
  FakeArena b{30};
  FakeArena c{0};
  CHECK(share.join(&a) == 0);
  CHECK(share.join(&b) == 1);
  CHECK(share.join(&c) == 2);
  CHECK(share.allowance(0) == 34);  // 64 - 30 - 0: its own excess is not counted
  CHECK(share.allowance(1) == 54);  // 64 - 10
  CHECK(share.allowance(2) == 24);  // 64 - 10 - 30
  c.excess = 40;                    // read on demand
  CHECK(share.allowance(0) == 0);   // 30 + 40 > 64
  CHECK(share.allowance(2) == 24);
}

TEST_CASE("shared slack: past its members a join is refused") {
  SharedSlack share(1);
  FakeArena a;
  for (int i = 0; i < SharedSlack::kMaxMembers; ++i) CHECK(share.join(&a) == i);
  CHECK(share.join(&a) == -1);
  CHECK(share.allowance(0) == 1);  // every member holds 0
}
