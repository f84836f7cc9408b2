// pgmutex run's own estimate of its lease deadline, for the guard process.
//
// The library keeps the real deadline in the mutex's grant book and does not
// show it. The command sees what the Metrics hooks tell: each good heartbeat
// (heartbeat_latency: the reply came `seconds` after the send), the acquire
// (acquire_latency) and each failed heartbeat. From those it keeps a deadline
// that is never later than the library's, by the library's own rule, applied
// with a margin of error:
//   - the lease counts from the send time of a heartbeat, never its reply;
//   - heartbeats commit asynchronously, so a good send counts only once a
//     later good send, at least one heartbeat interval after it, has
//     confirmed it (before that, the one before it still counts);
//   - a send time is estimated from when the hook ran minus the latency it
//     reports, a little later than the library's own reading of the clock:
//     the send the lease counts from is moved `slack` earlier;
//   - a failed heartbeat may precede a reconnect, after which the library no
//     longer lets the old connection's acknowledgements be confirmed: the
//     unconfirmed sends are dropped here too.
// What the hooks cannot show: a reconnect inside one heartbeat that then
// succeeds (the library drops the old session's unconfirmed sends; this
// estimate may not). The library accessor that would close that gap is a
// hook with the deadline itself (see README, "pgmutex run").
#pragma once

#include <chrono>
#include <deque>
#include <optional>

namespace pgmutex::cli {

class LeaseEstimate {
 public:
  using clock = std::chrono::steady_clock;
  using time_point = clock::time_point;
  using duration = std::chrono::nanoseconds;

  static constexpr duration default_slack = std::chrono::milliseconds(20);

  LeaseEstimate(duration lease, duration interval, bool asynchronous, duration slack = default_slack) noexcept
      : lease_(lease), interval_(interval), asynchronous_(asynchronous), slack_(slack) {}

  // The grant, whose acquire statement went out `sent` (estimated) ago.
  void granted(time_point sent);
  // A heartbeat sent at `sent` (estimated) succeeded.
  void beat_succeeded(time_point sent);
  // A heartbeat failed (it may have reconnected).
  void beat_failed() noexcept { recent_.clear(); }

  // The lease deadline, once granted: never later than the library's (see above).
  [[nodiscard]] std::optional<time_point> deadline() const noexcept {
    if (!trusted_) return std::nullopt;
    return *trusted_ + lease_;
  }

 private:
  duration lease_;
  duration interval_;
  bool asynchronous_;
  duration slack_;
  std::optional<time_point> trusted_;  // the (estimated, slack earlier) send the lease counts from
  time_point last_good_{};             // the newest good send seen (estimated)
  std::deque<time_point> recent_;      // good sends not yet confirmed (estimated)
};

}  // namespace pgmutex::cli
