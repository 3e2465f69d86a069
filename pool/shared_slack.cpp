#include "shared_slack.h"

namespace poolshim {

std::uint64_t SharedSlack::allowance(int self) const {
  std::uint64_t others = 0;
  for (int i = 0; i < count_; ++i) {
    if (i == self) continue;
    const Entry& e = members_[static_cast<std::size_t>(i)];
    others += e.excess(e.member);
    if (others >= budget_) return 0;
  }
  return budget_ - others;
}

}  // namespace poolshim
