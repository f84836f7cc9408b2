// pgmutex::BasicObserver: follows a lock's election without campaigning
// (issue 18). The first report says who leads now; every later one is a
// change in term order: elected, proclaimed, vacated, or expired (the
// leader stopped heartbeating and its lease ran out, nobody has taken over
// yet). A change it could not see (a lost connection, a failover) is never a
// silent jump: the report that follows says gap, and how many were missed
// when the count tells (detail/observer_cursor.hpp has the rules).
//
// On Postgres (a backend with its own connection) the observer LISTENs on
// the lock's election channel and a notification carries the whole change:
// no statement per change. It reads the leader once at the start, after a
// reconnect, and at the leader's stale deadline (to tell an expiry nobody
// announces). A backend that cannot LISTEN (a pool's, a Session's, the
// in-memory one) is read every poll_interval instead.
//
// An observer has its own backend (connection): it never waits behind a
// campaign. Used from one thread at a time.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <optional>
#include <stop_token>
#include <utility>

#include "pgmutex/asio/access.hpp"  // detail::AsyncAccess: Asio-free, the door into a mutex's state
#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/detail/observer_cursor.hpp"

namespace pgmutex {

namespace detail {
struct ElectionAccess;  // see election.hpp
}  // namespace detail

template <Backend B, Clock C = SteadyClock, Metrics M = NoMetrics, Executor E = ThreadExecutor>
class BasicObserver {
  static_assert(BackendKeepsElections<B>,
                "an observer needs a backend that keeps elections (BackendKeepsElections in "
                "pgmutex/backend_election.hpp)");

 public:
  using duration = std::chrono::nanoseconds;

  // The options name the election (table and lock name) and the reader's
  // stale threshold; poll_interval paces a backend that cannot LISTEN.
  // Throws InvalidArgumentError as a mutex does.
  BasicObserver(B backend, Options options, C clock, M metrics, E executor)
      : mutex_(std::move(backend), std::move(options), std::move(clock), std::move(metrics), std::move(executor)) {}
  BasicObserver(B backend, Options options, C clock = {}, M metrics = {})
    requires std::default_initializable<E>
      : mutex_(std::move(backend), std::move(options), std::move(clock), std::move(metrics)) {}

  // The expected-returning form of the constructors: Errc::invalid_argument
  // naming the option and the rule, instead of InvalidArgumentError.
  static Result<BasicObserver> create(B backend, Options options, C clock, M metrics, E executor) {
    auto made = BasicMutex<B, C, M, E>::create(std::move(backend), std::move(options), std::move(clock),
                                               std::move(metrics), std::move(executor));
    if (!made) return tl::unexpected(std::move(made.error()));
    return BasicObserver(std::move(*made));
  }
  static Result<BasicObserver> create(B backend, Options options, C clock = {}, M metrics = {})
    requires std::default_initializable<E>
  {
    return create(std::move(backend), std::move(options), std::move(clock), std::move(metrics), E{});
  }

  [[nodiscard]] std::string_view name() const noexcept { return mutex_.lock_name(); }

  // Creates the lock table, its queue and the elections table if missing. Idempotent.
  Result<void> create_schema(nothrow_t) { return mutex_.create_schema(nothrow); }
  void create_schema() { value_or_throw(create_schema(nothrow)); }

  // The next change, waiting up to `timeout` (none: until one comes) or
  // until `stop`: nullopt then. The first call reports the present
  // (LeaderEvent::current, nobody leading included). An error (the server
  // unreachable) loses nothing: the next call reads the leader again and
  // reports what was missed as a gap.
  Result<std::optional<LeaderChange>> next(nothrow_t, std::optional<duration> timeout = std::nullopt,
                                           std::stop_token stop = {}) {
    auto* state = detail::AsyncAccess::state_of(mutex_);
    const auto start = state->clock.now();
    for (;;) {
      if (!ready_.empty()) {
        LeaderChange c = std::move(ready_.front());
        ready_.pop_front();
        return std::optional<LeaderChange>(std::move(c));
      }
      if (stop.stop_requested()) return std::optional<LeaderChange>();
      if (must_read_) {
        if (auto read = read_now(*state); !read) return tl::unexpected(std::move(read.error()));
        continue;
      }
      const auto now = state->clock.now();
      duration left = std::chrono::hours(1);  // without a timeout: wait on, an hour at a time
      if (timeout) {
        left = std::min(left, *timeout - std::chrono::duration_cast<duration>(now - start));
        if (left <= duration::zero()) return std::optional<LeaderChange>();
      }
      if (check_at_) left = std::min(left, std::max(duration::zero(), std::chrono::duration_cast<duration>(*check_at_ - now)));
      if (auto waited = wait(*state, left, stop); !waited) return tl::unexpected(std::move(waited.error()));
      if (check_at_ && state->clock.now() >= *check_at_) must_read_ = true;
    }
  }
  std::optional<LeaderChange> next(std::optional<duration> timeout = std::nullopt, std::stop_token stop = {}) {
    return value_or_throw(next(nothrow, timeout, std::move(stop)));
  }

  // Calls `on_change` with every change, in order, on this thread, until
  // `stop` is requested. The server out of reach (backend_unavailable,
  // outcome_unknown, a statement's timeout) is waited out, a poll_interval
  // at a time: what changed meanwhile comes as a gap. Any other error (the
  // table missing, a privilege) ends it and is returned.
  Result<void> observe(nothrow_t, const std::function<void(const LeaderChange&)>& on_change, std::stop_token stop) {
    for (;;) {
      auto change = next_waiting_out(stop);
      if (!change) return tl::unexpected(std::move(change.error()));
      if (!*change) return {};
      on_change(**change);
    }
  }
  void observe(const std::function<void(const LeaderChange&)>& on_change, std::stop_token stop) {
    value_or_throw(observe(nothrow, on_change, std::move(stop)));
  }

  // The async forms, where the executor policy provides them (AsioExecutor,
  // <pgmutex/asio.hpp>; asio/election_ops.hpp), each taking a completion
  // token with cancellation; one at a time, and the observer must outlive
  // it, as an Asio socket its operations:
  //   async_next(timeout, token)  void(error_code, std::optional<LeaderChange>)
  //                               (nullopt: the timeout passed), as next();
  //   async_observe(token)        void(error_code, LeaderChange): the next
  //                               change, the server out of reach waited out
  //                               as observe() does; call it again for the next.
  template <class Token>
  decltype(auto) async_next(std::optional<duration> timeout, Token&& token) {
    return E::async_next(*this, timeout, std::forward<Token>(token));
  }
  template <class Token>
  decltype(auto) async_observe(Token&& token) {
    return E::async_observe(*this, std::forward<Token>(token));
  }

 private:
  friend struct detail::ElectionAccess;

  // The next change; the server out of reach (backend_unavailable,
  // outcome_unknown, a statement's timeout) is waited out a poll_interval
  // at a time. nullopt once `stop` is requested; any other error is returned.
  Result<std::optional<LeaderChange>> next_waiting_out(const std::stop_token& stop) {
    while (!stop.stop_requested()) {
      auto change = next(nothrow, std::nullopt, stop);
      if (change) {
        if (*change) return change;
        continue;
      }
      const Error& e = change.error();
      if (!(e == Errc::backend_unavailable || e == Errc::outcome_unknown || e == Errc::timeout))
        return tl::unexpected(std::move(change.error()));
      (void)detail::AsyncAccess::state_of(mutex_)->executor.wait_for(mutex_.options().poll_interval, stop);
    }
    return std::optional<LeaderChange>();
  }

  using State = detail::MutexState<B, C, M, E>;

  explicit BasicObserver(BasicMutex<B, C, M, E> mutex) noexcept : mutex_(std::move(mutex)) {}

  // Reads who leads and reports what changed. Where the backend LISTENs,
  // it listens first, so nothing announced after the reading is missed.
  Result<void> read_now(State& s) {
    if constexpr (BackendWaitsForElections<B>) {
      auto primed = s.io.run([&](auto& b) { return b.wait_for_election(s.io.lock_ref(), duration::zero(), {}); });
      if (!primed) return tl::unexpected(std::move(primed.error()));
    }
    auto record = s.io.run([&](auto& b) { return b.leader(s.io.lock_ref(), s.options.stale_threshold); });
    if (!record) return tl::unexpected(std::move(record.error()));
    must_read_ = false;
    if (auto c = cursor_.look(*record)) ready_.push_back(std::move(*c));
    // While somebody leads, read again at its stale deadline: an expiry is
    // announced by nobody. A little after it, so the row is stale by then.
    check_at_.reset();
    if (record->leading()) {
      const double left_s = std::max(0.0, record->stale_after_s - record->seconds_since_heartbeat) + 0.01;
      check_at_ = s.clock.now() + std::chrono::duration_cast<typename C::duration>(std::chrono::duration<double>(left_s));
    }
    return {};
  }

  // Waits for notices (or, without LISTEN, poll_interval) up to `left`.
  Result<void> wait(State& s, duration left, const std::stop_token& stop) {
    if constexpr (BackendWaitsForElections<B>) {
      auto wake = s.io.run([&](auto& b) { return b.wait_for_election(s.io.lock_ref(), left, stop); });
      if (!wake) {
        must_read_ = true;  // a new connection: read again, then listen on
        return tl::unexpected(std::move(wake.error()));
      }
      if (wake->resync) must_read_ = true;
      for (const ElectionNotice& n : wake->notices) {
        if (auto c = cursor_.hear(n)) {
          // A new or proclaimed term: its holder's row was live a moment
          // ago; its deadline is read when this reader's threshold passes.
          if (c->leader) {
            check_at_ = s.clock.now() + std::chrono::duration_cast<typename C::duration>(s.options.stale_threshold);
          } else {
            check_at_.reset();
          }
          ready_.push_back(std::move(*c));
        }
      }
    } else {
      if (s.executor.wait_for(std::min(left, s.options.poll_interval), stop)) return {};
      must_read_ = true;
    }
    return {};
  }

  BasicMutex<B, C, M, E> mutex_;  // the election's backend, options, clock and executor; never acquired
  detail::ObserverCursor cursor_;
  std::deque<LeaderChange> ready_;
  std::optional<typename C::time_point> check_at_;
  bool must_read_ = true;
};

}  // namespace pgmutex
