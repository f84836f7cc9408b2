#include "lease_estimate.hpp"

#include <algorithm>

namespace pgmutex::cli {
namespace {

// As the library's book: beyond this many unconfirmed sends the oldest is
// dropped unconfirmed (only manual heartbeats come that fast).
constexpr std::size_t max_recent = 64;

}  // namespace

void LeaseEstimate::granted(time_point sent) {
  trusted_ = sent - slack_;  // an acquire commits synchronously
  last_good_ = sent;
  recent_.clear();
  if (asynchronous_) recent_.push_back(sent);
}

void LeaseEstimate::beat_succeeded(time_point sent) {
  if (!trusted_ || sent <= last_good_) return;
  last_good_ = sent;
  if (!asynchronous_) {
    trusted_ = std::max(*trusted_, sent - slack_);
    return;
  }
  // A send is confirmed by a later one at least an interval after it. Both
  // are estimates, but the library never sends an automatic heartbeat sooner
  // than an interval plus the previous one's round trip after a good one
  // (sooner only after a failure, which cleared recent_), so an error of the
  // estimates (far below a round trip) can delay a confirmation, never make
  // one the library would not make.
  while (!recent_.empty() && sent - recent_.front() >= interval_) {
    trusted_ = std::max(*trusted_, recent_.front() - slack_);
    recent_.pop_front();
  }
  if (recent_.size() == max_recent) recent_.pop_front();
  recent_.push_back(sent);
}

}  // namespace pgmutex::cli
