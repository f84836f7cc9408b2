// Between the library's Metrics hooks and the guard process: each good
// heartbeat renews pgmutex run's estimate of its lease deadline
// (lease_estimate.hpp), and each deadline that moves goes to the guard.
#pragma once

#include <chrono>
#include <mutex>
#include <optional>

#include "guardian.hpp"
#include "lease_estimate.hpp"

namespace pgmutex::cli {

class LeaseWatch {
 public:
  using time_point = LeaseEstimate::time_point;

  // Before the first acquire: the mutex's validated lease and heartbeat interval.
  void configure(std::chrono::nanoseconds lease, std::chrono::nanoseconds interval);

  // From the hooks, on any thread: the statement's reply came `latency_s`
  // after it was sent, and the hook runs now.
  void acquired(double latency_s);
  void beat_succeeded(double latency_s);
  void beat_failed();

  [[nodiscard]] std::optional<time_point> deadline() const;

  // From now on (until detach) every deadline that moves goes to `guardian`.
  void attach(Guardian& guardian);
  void detach() noexcept;

 private:
  void send_if_moved();  // with mutex_ held

  mutable std::mutex mutex_;
  std::optional<LeaseEstimate> estimate_;
  std::optional<time_point> sent_;  // the last deadline the guard was given
  Guardian* guardian_ = nullptr;
};

// Detaches on scope exit, before the guardian goes.
class LeaseWatchAttachment {
 public:
  LeaseWatchAttachment(LeaseWatch& watch, Guardian& guardian) : watch_(watch) { watch_.attach(guardian); }
  ~LeaseWatchAttachment() { watch_.detach(); }
  LeaseWatchAttachment(const LeaseWatchAttachment&) = delete;
  LeaseWatchAttachment& operator=(const LeaseWatchAttachment&) = delete;

 private:
  LeaseWatch& watch_;
};

}  // namespace pgmutex::cli
