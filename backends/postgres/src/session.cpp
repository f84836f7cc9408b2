// An operation's bound: the client deadline and the server timeouts drawn
// from one budget (session.hpp).
#include "session.hpp"

#include <algorithm>

namespace pgmutex::postgres_detail {

Bound Bound::from(std::chrono::nanoseconds timeout) {
  using std::chrono::milliseconds;
  // statement_timeout is an int of milliseconds, and now() + a huge timeout
  // would overflow: a day is longer than any lock operation should take.
  timeout = std::clamp(timeout, std::chrono::nanoseconds(milliseconds(1)),
                       std::chrono::nanoseconds(std::chrono::hours(24)));
  const auto whole = std::chrono::duration_cast<milliseconds>(timeout);
  return Bound{std::chrono::steady_clock::now() + timeout, std::max(milliseconds(1), whole * 3 / 4),
               std::max(milliseconds(1), whole / 2)};
}

}  // namespace pgmutex::postgres_detail
