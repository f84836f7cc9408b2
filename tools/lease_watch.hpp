// Between the library's Metrics hooks and the guard process: each lease
// deadline the mutex sets (the lease_renewed hook: at the grant, and each time
// a heartbeat the server is known to keep moves it) goes to the guard, which
// enforces it even while pgmutex itself is stopped. The deadline is the
// mutex's own, on CLOCK_MONOTONIC (SteadyClock), which the guard process
// shares: never an estimate of it.
#pragma once

#include <chrono>
#include <mutex>
#include <optional>

#include "guardian.hpp"

namespace pgmutex::cli {

class LeaseWatch {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  // From the hook, on any thread: the mutex's new lease deadline.
  void renewed(std::chrono::nanoseconds deadline_since_epoch);

  [[nodiscard]] std::optional<time_point> deadline() const;

  // From now on (until detach) every deadline that moves goes to `guardian`.
  void attach(Guardian& guardian);
  void detach() noexcept;

 private:
  void send_if_moved();  // with mutex_ held

  mutable std::mutex mutex_;
  std::optional<time_point> deadline_;
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
