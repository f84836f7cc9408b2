// Each lease deadline the mutex sets, passed on to the guard process
// (lease_watch.hpp).
#include "lease_watch.hpp"

#include <algorithm>

namespace pgmutex::cli {

void LeaseWatch::renewed(std::chrono::nanoseconds deadline_since_epoch) {
  const std::lock_guard lock(mutex_);
  const time_point deadline(std::chrono::duration_cast<time_point::duration>(deadline_since_epoch));
  // A new grant may count from an earlier send than the last one's deadline:
  // each grant's first deadline is taken as it is (attach() resets sent_).
  deadline_ = deadline;
  send_if_moved();
}

std::optional<LeaseWatch::time_point> LeaseWatch::deadline() const {
  const std::lock_guard lock(mutex_);
  return deadline_;
}

void LeaseWatch::attach(Guardian& guardian) {
  const std::lock_guard lock(mutex_);
  guardian_ = &guardian;
  sent_.reset();
  send_if_moved();
}

void LeaseWatch::detach() noexcept {
  const std::lock_guard lock(mutex_);
  guardian_ = nullptr;
}

void LeaseWatch::send_if_moved() {
  if (guardian_ == nullptr || !deadline_ || deadline_ == sent_) return;
  guardian_->renew(*deadline_);
  sent_ = deadline_;
}

}  // namespace pgmutex::cli
