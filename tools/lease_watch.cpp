#include "lease_watch.hpp"

namespace pgmutex::cli {
namespace {

// When the statement went out: the hook runs a little after the library read
// the clock for the reply, so this is a little late (LeaseEstimate's slack).
LeaseEstimate::time_point sent_at(double latency_s) {
  return LeaseEstimate::clock::now() -
         std::chrono::duration_cast<LeaseEstimate::duration>(std::chrono::duration<double>(latency_s));
}

}  // namespace

void LeaseWatch::configure(std::chrono::nanoseconds lease, std::chrono::nanoseconds interval) {
  const std::lock_guard lock(mutex_);
  // pgmutex run's backend commits heartbeats asynchronously; should it commit
  // them synchronously, counting them as asynchronous is only more cautious.
  estimate_.emplace(lease, interval, /*asynchronous=*/true);
}

void LeaseWatch::acquired(double latency_s) {
  const std::lock_guard lock(mutex_);
  if (!estimate_) return;
  estimate_->granted(sent_at(latency_s));
  send_if_moved();
}

void LeaseWatch::beat_succeeded(double latency_s) {
  const std::lock_guard lock(mutex_);
  if (!estimate_) return;
  estimate_->beat_succeeded(sent_at(latency_s));
  send_if_moved();
}

void LeaseWatch::beat_failed() {
  const std::lock_guard lock(mutex_);
  if (estimate_) estimate_->beat_failed();
}

std::optional<LeaseWatch::time_point> LeaseWatch::deadline() const {
  const std::lock_guard lock(mutex_);
  return estimate_ ? estimate_->deadline() : std::nullopt;
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
  const auto deadline = estimate_->deadline();
  if (guardian_ == nullptr || !deadline || deadline == sent_) return;
  guardian_->renew(*deadline);
  sent_ = deadline;
}

}  // namespace pgmutex::cli
