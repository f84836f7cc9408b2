// pgmutex::BasicElection: leader election on a lock (issue 18). A campaign
// waits in the lock's queue like any acquire (first come, first served; one
// wake-up per handoff), and the statement that grants it the lock announces
// its value: the term is the grant's fence, the value what the leader tells
// the others (its address, its shard map). The leadership it returns is a
// guard with a value (leadership.hpp).
// leader() reads who leads in one statement; observer() follows every
// change (pgmutex/observer.hpp). Aliases next to the mutex's: pgmutex::Election
// (Postgres, pgmutex/mutex.hpp), pgmutex::SessionElection (pgmutex/session.hpp)
// and pgmutex::testing::SimElection (the simulation).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>

#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/leadership.hpp"
#include "pgmutex/observer.hpp"

namespace pgmutex {

namespace detail {
template <class Guard>
struct GuardState;
template <class State>
struct GuardState<BasicGuard<State>> {
  using type = State;
};

// Who leads, in one statement on the election's backend.
template <class State>
Result<std::optional<Leader>> read_leader(State& s) {
  auto record = s.io.run([&](auto& backend) { return backend.leader(s.io.lock_ref(), s.options.stale_threshold); });
  if (!record) return tl::unexpected(std::move(record.error()));
  return leader_of(*record);
}

// The same if no statement of `s` is under way; nullopt at once if one is.
template <class State>
std::optional<Result<std::optional<Leader>>> try_read_leader(State& s) {
  auto record =
      s.io.try_run([&](auto& backend) { return backend.leader(s.io.lock_ref(), s.options.stale_threshold); });
  if (!record) return std::nullopt;
  if (!*record) return Result<std::optional<Leader>>(tl::unexpected(std::move(record->error())));
  return Result<std::optional<Leader>>(leader_of(**record));
}
}  // namespace detail

template <Backend B, Clock C = SteadyClock, Metrics M = NoMetrics, Executor E = ThreadExecutor>
class BasicElection {
  static_assert(BackendKeepsElections<B>,
                "an election needs a backend that keeps elections: leader(), announce() and vacate() "
                "(BackendKeepsElections in pgmutex/backend_election.hpp)");
  static_assert(BackendElectsInOneStatement<B>,
                "an election needs a backend that grants and announces, and vacates and releases, in one "
                "statement each: try_acquire(request, GrantAnnouncement&) and release_vacating(key) "
                "(BackendElectsInOneStatement in pgmutex/backend_election.hpp)");

 public:
  using mutex_type = BasicMutex<B, C, M, E>;
  using guard_type = typename mutex_type::guard_type;
  using leadership_type = BasicLeadership<typename detail::GuardState<guard_type>::type>;
  using duration = std::chrono::nanoseconds;

  // Throws InvalidArgumentError naming the option and the rule it breaks.
  // The lock name is the election's name; every candidate and observer of
  // one election uses the same table and lock name.
  BasicElection(B backend, Options options, C clock, M metrics, E executor)
      : mutex_(std::move(backend), std::move(options), std::move(clock), std::move(metrics), std::move(executor)) {}
  BasicElection(B backend, Options options, C clock = {}, M metrics = {})
    requires std::default_initializable<E>
      : mutex_(std::move(backend), std::move(options), std::move(clock), std::move(metrics)) {}

  // The expected-returning form of the constructors: Errc::invalid_argument
  // naming the option and the rule, instead of InvalidArgumentError.
  static Result<BasicElection> create(B backend, Options options, C clock, M metrics, E executor) {
    auto made = mutex_type::create(std::move(backend), std::move(options), std::move(clock), std::move(metrics),
                                   std::move(executor));
    if (!made) return tl::unexpected(std::move(made.error()));
    return BasicElection(std::move(*made));
  }
  static Result<BasicElection> create(B backend, Options options, C clock = {}, M metrics = {})
    requires std::default_initializable<E>
  {
    return create(std::move(backend), std::move(options), std::move(clock), std::move(metrics), E{});
  }

  [[nodiscard]] const ValidOptions& options() const noexcept { return mutex_.options(); }
  [[nodiscard]] std::string_view name() const noexcept { return mutex_.lock_name(); }

  // Creates the lock table, its queue and the elections table if missing. Idempotent.
  Result<void> create_schema(nothrow_t) { return mutex_.create_schema(nothrow); }
  void create_schema() { value_or_throw(create_schema(nothrow)); }

  // Waits in line until this candidate leads, `timeout` passes or `stop` is
  // requested (an empty leadership whose why() says which); the statement
  // that grants it the lock announces `value` (one transaction: observers
  // hear 'elected' at its commit). Errc::invalid_argument for a value over
  // max_election_value_bytes (before waiting); Errc::already_acquired while
  // this object leads.
  Result<leadership_type> campaign(nothrow_t, std::string value, std::optional<duration> timeout = std::nullopt,
                                   std::stop_token stop = {}) {
    if (auto valid = validate_election_value(name(), value); !valid) return tl::unexpected(std::move(valid.error()));
    GrantAnnouncement announcement{value};
    auto guard = detail::AsyncAccess::state_of(mutex_)->campaign(timeout, std::move(stop), announcement);
    if (!guard) return tl::unexpected(std::move(guard.error()));
    const bool announced = announcement.announced;  // before `value` moves: the announcement views it
    return detail::ElectionAccess::take_office<leadership_type>(std::move(*guard), std::move(value), announced);
  }
  leadership_type campaign(std::string value, std::optional<duration> timeout = std::nullopt, std::stop_token stop = {}) {
    return value_or_throw(campaign(nothrow, std::move(value), timeout, std::move(stop)));
  }

  // Who leads now, in one statement; nullopt while nobody does (never
  // elected, resigned, or the leader's grant stale or taken over).
  // It never waits behind this object's own statements: while a campaign
  // waits in line (its wait holds the object's connection), or while this
  // object leads (a slow read must not delay its heartbeats), it reads on a
  // backend of its own, made at the first such call (share(): the same pool
  // or Session, else a connection of its own) and kept.
  Result<std::optional<Leader>> leader(nothrow_t) {
    auto* state = detail::AsyncAccess::state_of(mutex_);
    if (!state->held_fence(state->clock.now()))
      if (auto read = detail::try_read_leader(*state)) return std::move(*read);
    auto reader = leader_reader();
    if (!reader) return tl::unexpected(std::move(reader.error()));
    return detail::read_leader(*detail::AsyncAccess::state_of(**reader));
  }
  std::optional<Leader> leader() { return value_or_throw(leader(nothrow)); }

  // An observer of this election (pgmutex/observer.hpp) on another backend
  // to the same server (the backend's share(), else a copy: on Postgres a
  // connection of its own), so that its waits never queue behind this
  // object's campaign: a candidate that also follows who leads.
  Result<BasicObserver<B, C, M, E>> observer(nothrow_t) {
    auto* state = detail::AsyncAccess::state_of(mutex_);
    auto options = detail::options_for_lock(state->options, name());
    if (!options) return tl::unexpected(std::move(options.error()));
    return BasicObserver<B, C, M, E>(detail::share_backend(state->io.backend), std::move(*options), state->clock,
                                     state->metrics, state->executor);
  }
  BasicObserver<B, C, M, E> observer() { return value_or_throw(observer(nothrow)); }

  // The async forms, where the executor policy provides them (AsioExecutor,
  // <pgmutex/asio.hpp>; asio/election_ops.hpp), each taking a completion token:
  //   async_campaign(value, timeout, token)  void(error_code, Leadership)
  //   async_leader(token)                    void(error_code, std::optional<Leader>)
  // and on the leadership, async_proclaim(value, token) and async_resign(token).
  template <class Token>
  decltype(auto) async_campaign(std::string value, std::optional<duration> timeout, Token&& token) {
    return E::async_campaign(*this, std::move(value), timeout, std::forward<Token>(token));
  }
  template <class Token>
  decltype(auto) async_leader(Token&& token) {
    return E::async_leader(*this, std::forward<Token>(token));
  }

 private:
  friend struct detail::ElectionAccess;

  explicit BasicElection(mutex_type mutex) noexcept : mutex_(std::move(mutex)) {}

  // leader()'s own backend, made once (under its lock: leader() may be
  // called from several threads; one that cannot be made is tried again at
  // the next call).
  struct LeaderReader {
    std::mutex made;
    std::optional<mutex_type> mutex;
  };
  Result<mutex_type*> leader_reader() {
    std::lock_guard lock(reader_->made);
    if (!reader_->mutex) {
      auto* state = detail::AsyncAccess::state_of(mutex_);
      auto options = detail::options_for_lock(state->options, name());
      if (!options) return tl::unexpected(std::move(options.error()));
      auto made = mutex_type::create(detail::share_backend(state->io.backend), std::move(*options), state->clock,
                                     state->metrics, state->executor);
      if (!made) return tl::unexpected(std::move(made.error()));
      reader_->mutex.emplace(std::move(*made));
    }
    return &*reader_->mutex;
  }

  mutex_type mutex_;
  std::unique_ptr<LeaderReader> reader_ = std::make_unique<LeaderReader>();
};

}  // namespace pgmutex
