// How a blocking acquire waits in the lock's queue, on a backend that queues
// waiters (BackendQueuesWaiters): a plain try, then a place at the back of
// the queue, then no statement until the backend wakes it (its turn came, or
// the lock may be available), then a queued try that confirms the offer or
// takes the lock. A timeout or a stop leaves the queue. Like AcquireWait, it
// only calls the state's tries and the statements' queue operations. Not
// part of the API.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <stop_token>
#include <utility>

#include "pgmutex/backend.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/detail/lock_statements.hpp"

namespace pgmutex::detail {

// A friend of the guard: a refused try's holder moves into the guard the
// wait returns.
struct QueueWait {
  using duration = std::chrono::nanoseconds;

  // Without a timeout, a waiter still looks again this often (a wake-up
  // missed by every path that should have sent it).
  static constexpr duration look_without_timeout = std::chrono::hours(1);

  // `announce`: a campaign's (MutexState::campaign), passed to every try.
  template <class State, class Announce = NoAnnouncement>
  static Result<typename State::guard_type> run(State& s, std::optional<duration> timeout, std::stop_token stop,
                                                Announce announce = {}) {
    using guard_type = typename State::guard_type;
    const auto start = s.clock.now();
    // How long the wait may still last; nullopt: no timeout.
    auto left = [&]() -> std::optional<duration> {
      if (!timeout) return std::nullopt;
      return *timeout - std::chrono::duration_cast<duration>(s.clock.now() - start);
    };
    auto sleep = [&](duration most) {  // true: stopped
      const auto l = left();
      return s.executor.wait_for(std::min(l ? std::max(*l, duration::zero()) : most, most), stop);
    };
    for (;;) {
      // A plain try: a free lock with nobody in line is taken at once.
      auto attempt = s.try_acquire(announce);
      if (!attempt && !transient(attempt.error())) return attempt;
      if (attempt && *attempt) return attempt;
      if (const auto l = left(); l && *l <= duration::zero()) {
        if (!attempt) return attempt;  // the backend never answered: say so, not "timeout"
        return guard_type(Errc::timeout, std::move(attempt->holder_));
      }
      if (stop.stop_requested()) return guard_type(Errc::cancelled, attempt ? std::move(attempt->holder_) : std::nullopt);
      // A failover grace refuses everyone alike and no release will come:
      // sleep through it. A failed try: back off, then try again.
      if (!attempt || in_grace(*attempt)) {
        if (sleep(s.options.poll_interval))
          return guard_type(Errc::cancelled, attempt ? std::move(attempt->holder_) : std::nullopt);
        continue;
      }
      auto queued = s.io.enqueue();
      if (!queued) {
        if (!transient(queued.error())) return tl::unexpected(std::move(queued.error()));
        if (sleep(s.options.poll_interval)) return guard_type(Errc::cancelled, std::move(attempt->holder_));
        continue;
      }
      auto outcome = wait_in_line(s, *queued, std::move(*attempt), left, stop, announce);
      if (outcome) return std::move(*outcome);
      // The place was lost (an offer that lapsed, a sweep after a
      // reconnect): in line again, at the back.
    }
  }

 private:
  static bool transient(const Error& e) noexcept {
    return e == Errc::backend_unavailable || e == Errc::outcome_unknown;
  }

  template <class Guard>
  static bool in_grace(const Guard& refused) noexcept {
    return refused.holder() && refused.holder()->failover_grace_left_s > 0;
  }

  // In line until granted (a guard), refused for good (an error, a timeout,
  // a cancellation: the place is left), or the place is lost (nullopt).
  template <class State, class Left, class Announce>
  static std::optional<Result<typename State::guard_type>> wait_in_line(State& s, QueuedWaiter& queued,
                                                                        typename State::guard_type refused, Left& left,
                                                                        std::stop_token& stop, Announce announce) {
    using guard_type = typename State::guard_type;
    auto leave = [&](Errc why) -> Result<guard_type> {
      (void)s.io.dequeue(queued);  // failed: the place lapses by itself (a dead connection, a handoff deadline)
      return guard_type(why, std::move(refused.holder_));
    };
    bool try_now = queued.place.try_now;
    for (;;) {
      if (try_now) {
        bool place_lost = false;
        auto attempt = s.try_acquire_queued(queued, place_lost, announce);
        if (attempt && *attempt) return attempt;
        if (!attempt && !transient(attempt.error())) {
          (void)s.io.dequeue(queued);
          return attempt;
        }
        if (attempt) {
          refused = std::move(*attempt);
          if (place_lost) return std::nullopt;
        }
        try_now = false;
        // A failed queued try, or a refusal by a failover grace: look again
        // after a poll interval (the place is kept meanwhile).
        if (!attempt || in_grace(refused)) {
          const auto l = left();
          if (l && *l <= duration::zero()) return leave(Errc::timeout);
          if (s.executor.wait_for(std::min(l ? *l : s.options.poll_interval, s.options.poll_interval), stop))
            return leave(Errc::cancelled);
          try_now = true;
          continue;
        }
      }
      const auto l = left();
      if (l && *l <= duration::zero()) return leave(Errc::timeout);
      if (stop.stop_requested()) return leave(Errc::cancelled);
      const duration limit = l ? *l : look_without_timeout;
      const WatchRequest w = line_watch_of(s, refused);
      using B = decltype(s.io.backend);
      if constexpr (BackendWaitsInQueue<B>) {
        auto woke = s.io.wait_in_queue(queued, w, limit, stop);
        if (!woke) {
          // The connection failed while waiting: back off, then a queued try
          // says whether the place survived.
          if (s.executor.wait_for(std::min(limit, s.options.poll_interval), stop)) return leave(Errc::cancelled);
          try_now = true;
          continue;
        }
        if (*woke == QueueWake::stopped) return leave(Errc::cancelled);
        // Without a timeout, the hourly limit passing is the look that
        // catches a missed wake-up (with one, the top of the loop leaves).
        try_now = *woke == QueueWake::turn || *woke == QueueWake::look || (*woke == QueueWake::timed_out && !l);
      } else {
        static_assert(BackendPollsQueue<B>, "a queueing backend either blocks in the queue or answers a look");
        for (;;) {
          if (auto woke = s.io.queue_wake(queued, w)) {
            try_now = *woke == QueueWake::turn || *woke == QueueWake::look;
            break;
          }
          const auto still = left();
          if (still && *still <= duration::zero()) break;
          if (s.executor.wait_for(std::min(still ? *still : s.options.poll_interval, s.options.poll_interval), stop))
            return leave(Errc::cancelled);
        }
      }
    }
  }

 public:
  // As watch_of, but a waiter in line also looks when the holder would pass
  // the alert threshold (holder_stale_in is when to look): a silent holder
  // is then reported (the alert hook) before the line reclaims its lock, as
  // a polling waiter reported it.
  template <class State>
  static WatchRequest line_watch_of(const State& s, const typename State::guard_type& refused) {
    WatchRequest w = watch_of(s, refused);
    if (refused.holder() && w.holder_stale_in) {
      const duration alert_in = std::chrono::duration_cast<duration>(
          s.options.alert_threshold - s.io.age(refused.holder()->seconds_since_heartbeat));
      if (alert_in > duration::zero()) w.holder_stale_in = std::min(*w.holder_stale_in, alert_in);
    }
    return w;
  }

  // What a waiter knows of the holder its last try met.
  template <class State>
  static WatchRequest watch_of(const State& s, const typename State::guard_type& refused) {
    WatchRequest w{s.io.lock_ref(), s.options.stale_threshold, std::nullopt};
    if (refused.holder())
      w.holder_stale_in = holder_stale_look_in(s.options.stale_threshold,
                                               s.io.age(refused.holder()->seconds_since_heartbeat));
    return w;
  }
};

}  // namespace pgmutex::detail
