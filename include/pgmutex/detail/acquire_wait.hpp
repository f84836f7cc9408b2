// How a blocking acquire waits between tries: in the lock's queue
// (detail/queue_wait.hpp) where the backend keeps one, else a backend that watches locks
// for all its waiters, one that waits for a release itself, or a sleep
// through the poll interval; a timeout, a stop token and transient failures
// end or continue the wait. It only calls the state's try_acquire and the
// backend's waits: the grant's book and the lease timer are not its business.
// Not part of the API.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <stop_token>
#include <utility>

#include "pgmutex/backend.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/detail/queue_wait.hpp"

namespace pgmutex::detail {

// A friend of the guard: a refused try's holder moves into the guard the
// wait returns.
struct AcquireWait {
  // A watching backend wakes a waiter when the lock may be free; without a
  // timeout, the waiter still looks again this often.
  static constexpr std::chrono::nanoseconds watch_without_timeout = std::chrono::hours(1);

  // `announce`: a campaign's (MutexState::campaign), passed to every try.
  template <class State, class Announce = NoAnnouncement>
  static Result<typename State::guard_type> run(State& s, std::optional<std::chrono::nanoseconds> timeout,
                                                std::stop_token stop, Announce announce = {}) {
    using duration = std::chrono::nanoseconds;
    using guard_type = typename State::guard_type;
    using B = decltype(s.io.backend);
    if constexpr (BackendQueuesWaiters<B>) return QueueWait::run(s, timeout, std::move(stop), announce);
    const auto start = s.clock.now();
    for (;;) {
      auto attempt = s.try_acquire(announce);
      const bool transient = !attempt && (attempt.error() == Errc::backend_unavailable ||
                                          attempt.error() == Errc::outcome_unknown);
      if (!attempt && !transient) return attempt;
      if (attempt && *attempt) return attempt;

      duration wait = BackendWatchesLocks<B> ? watch_without_timeout : s.options.poll_interval;
      if (timeout) {
        const duration left = *timeout - std::chrono::duration_cast<duration>(s.clock.now() - start);
        if (left <= duration::zero()) {
          if (!attempt) return attempt;  // the backend never answered: say so, not "timeout"
          return guard_type(Errc::timeout, std::move(attempt->holder_));
        }
        wait = std::min(wait, left);
      }
      if (stop.stop_requested()) return guard_type(Errc::cancelled, attempt ? std::move(attempt->holder_) : std::nullopt);
      bool waited = false;
      // Refused by a failover grace: no release will come, and a backend
      // that polls would see the lock free at once: sleep through it.
      const bool grace = attempt && attempt->holder() && attempt->holder()->failover_grace_left_s > 0;
      if constexpr (BackendWatchesLocks<B>) {
        // A backend that hears of every release for all its waiters at
        // once: sleep until it says the lock may be free (a release, the
        // holder's stale deadline, a re-check), not one poll_interval.
        if (attempt && !grace) {
          const duration limit = timeout ? wait : watch_without_timeout;
          auto woke = s.io.backend.wait_until_free(QueueWait::watch_of(s, *attempt), limit, stop);
          if (stop.stop_requested()) return guard_type(Errc::cancelled, std::move(attempt->holder_));
          waited = woke.has_value();
        }
      } else if constexpr (BackendWaitsForRelease<B>) {
        if (!grace) {
          auto woke = s.io.wait_for_release(wait);
          if (!woke) return tl::unexpected(std::move(woke.error()));
          waited = *woke;
        }
      }
      // No way to be told of a release, or it failed just now: sleep through the poll interval.
      if (!waited && s.executor.wait_for(std::min(wait, s.options.poll_interval), stop))
        return guard_type(Errc::cancelled, attempt ? std::move(attempt->holder_) : std::nullopt);
    }
  }
};

}  // namespace pgmutex::detail
