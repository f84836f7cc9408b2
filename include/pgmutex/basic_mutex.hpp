// BasicMutex: one named lock in a lock table, over four policies.
//
//   Backend   the lock table (PostgresBackend, MemoryBackend, ...)
//   Clock     the client's monotonic time (cadence, waits, watchdog)
//   Metrics   hooks (any subset; absent ones cost nothing)
//   Executor  where the automatic heartbeat and timed waits run
//
// Every operation has an expected-returning form (pass pgmutex::nothrow) and a
// throwing form built on it.
//
// The execution model (DESIGN.md): the lease deadline is a timer task that does
// no I/O and takes no lock an I/O path holds; statements run on the caller's
// thread or, for the automatic heartbeat, on the executor's I/O side, each
// with a deadline; stop callbacks and metrics hooks run with no internal lock
// held. Three units show it: detail::GrantBook (the grant's bookkeeping behind
// a short lock), the wake-up (on_wakeup: the lease timer and the heartbeat's
// cadence) and the I/O (run_heartbeat, and the operations below).
#pragma once

#include <algorithm>
#include <atomic>
#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "pgmutex/backend.hpp"
#include "pgmutex/clock.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/executor.hpp"
#include "pgmutex/detail/grant_book.hpp"
#include "pgmutex/detail/io_gate.hpp"
#include "pgmutex/detail/light_mutex.hpp"
#include "pgmutex/detail/lockable.hpp"
#include "pgmutex/guard.hpp"
#include "pgmutex/metrics.hpp"
#include "pgmutex/options.hpp"
#include "pgmutex/singleton.hpp"

namespace pgmutex {

namespace detail {
// Reaches a mutex's and a guard's shared state for an executor's async forms
// (defined with AsioExecutor, in pgmutex/asio/); nothing else uses it.
struct AsyncAccess;
}  // namespace detail

template <Backend B, Clock C = SteadyClock, Metrics M = NoMetrics, Executor E = ThreadExecutor>
class BasicMutex {
  class State;

 public:
  using backend_type = B;
  using clock_type = C;
  using metrics_type = M;
  using executor_type = E;
  using guard_type = BasicGuard<State>;
  using duration = std::chrono::nanoseconds;

  // Throws InvalidArgumentError naming the option and the rule it breaks.
  BasicMutex(B backend, Options options, C clock = {}, M metrics = {}, E executor = {})
      : state_(value_or_throw(make_state(std::move(backend), std::move(options), std::move(clock), std::move(metrics),
                                         std::move(executor)))) {}

  static Result<BasicMutex> create(B backend, Options options, C clock = {}, M metrics = {}, E executor = {}) {
    auto state = make_state(std::move(backend), std::move(options), std::move(clock), std::move(metrics),
                            std::move(executor));
    if (!state) return tl::unexpected(std::move(state.error()));
    return BasicMutex(*state);
  }

  BasicMutex(BasicMutex&& other) noexcept
      : state_(std::exchange(other.state_, nullptr)), locked_(std::move(other.locked_)) {}
  BasicMutex& operator=(BasicMutex&& other) noexcept {
    if (this != &other) {
      locked_ = std::move(other.locked_);  // releases a grant this one kept for lock()
      if (state_ != nullptr) State::drop_owner(state_);
      state_ = std::exchange(other.state_, nullptr);
    }
    return *this;
  }
  BasicMutex(const BasicMutex&) = delete;
  BasicMutex& operator=(const BasicMutex&) = delete;
  // A guard that outlives its mutex keeps the lock (and its heartbeat) alive
  // until it is released; the state goes with the last of them.
  ~BasicMutex() {
    if (state_ != nullptr) State::drop_owner(state_);
  }

  [[nodiscard]] const ValidOptions& options() const noexcept { return state_->options; }
  [[nodiscard]] std::string_view lock_name() const noexcept { return state_->options.lock_name; }
  [[nodiscard]] std::string_view instance_id() const noexcept { return state_->options.instance_id; }
  [[nodiscard]] M& metrics() noexcept { return state_->metrics; }

  // Creates the lock table if missing, upgrades one without our columns. Idempotent.
  Result<void> create_schema(nothrow_t) { return state_->create_schema(); }
  void create_schema() { value_or_throw(create_schema(nothrow)); }

  // One try. An empty guard (false) if another instance holds the lock; an
  // error only if the backend failed or this object already holds the lock.
  Result<guard_type> try_acquire(nothrow_t) { return state_->try_acquire(); }
  guard_type try_acquire() { return value_or_throw(try_acquire(nothrow)); }

  // Tries until acquired, `timeout` passes (empty guard, why() == timeout), or
  // `stop` is requested (empty guard, why() == cancelled). No timeout: waits forever.
  Result<guard_type> acquire(nothrow_t, std::optional<duration> timeout = std::nullopt, std::stop_token stop = {}) {
    return state_->acquire(timeout, std::move(stop));
  }
  guard_type acquire(std::optional<duration> timeout = std::nullopt, std::stop_token stop = {}) {
    return value_or_throw(acquire(nothrow, timeout, std::move(stop)));
  }

  // Releases the current grant (the guard's destructor does it too).
  Result<void> release(nothrow_t) { return state_->release_current(); }
  void release() { value_or_throw(release(nothrow)); }

  // A manual heartbeat. Errc::lock_not_held if not held or the lease was lost.
  Result<void> heartbeat(nothrow_t) { return state_->heartbeat_current(); }
  void heartbeat() { value_or_throw(heartbeat(nothrow)); }

  // The lock's row as the backend sees it now, if anyone holds it.
  Result<std::optional<LockRow>> inspect(nothrow_t) { return state_->inspect(); }
  std::optional<LockRow> inspect() { return value_or_throw(inspect(nothrow)); }

  // Held through this object, and the lease not lost: the clock is compared
  // with the lease deadline at this moment. Never waits for I/O.
  [[nodiscard]] bool held() const noexcept { return state_->book.holds(state_->clock.now()); }

  // ---- Lockable: for std::unique_lock, std::scoped_lock and std::lock ----
  // lock() is acquire() with no timeout; try_lock() is one try, false when
  // another instance holds the lock; unlock() releases the grant they took.
  // The standard interface has no guard to hand back, so this object keeps
  // it: lock_guard() shows it. Locking again before unlock() is
  // Errc::already_acquired (LockHeldError). unlock() throws LockNotHeldError
  // only when nothing is locked: it runs in std::unique_lock's destructor,
  // so a failed release (a lost lease) is dropped as the guard's destructor
  // drops it; unlock(nothrow) returns it. Not for two threads at once on one
  // object: each thread that competes for the lock needs its own mutex.
  Result<void> lock(nothrow_t) { return detail::lock_into(*this, locked_); }
  void lock() { value_or_throw(lock(nothrow)); }
  Result<bool> try_lock(nothrow_t) { return detail::try_lock_into(*this, locked_); }
  bool try_lock() { return value_or_throw(try_lock(nothrow)); }
  Result<void> unlock(nothrow_t) { return detail::unlock_from(*this, locked_); }
  void unlock() { detail::unlock_or_throw_if_not_locked(*this, locked_); }

  // The guard of the grant lock()/try_lock() took, for its fence(), lost()
  // and stop_token(); nullptr when nothing is locked. Valid until unlock()
  // or a move of this mutex.
  [[nodiscard]] const guard_type* lock_guard() const noexcept { return locked_.owns_lock() ? &locked_ : nullptr; }

  // ---- Async forms: where the executor policy provides them (AsioExecutor,
  // <pgmutex/asio.hpp>). Each takes an Asio completion token; the guard's
  // async_release, async_heartbeat and async_wait_lost are on the guard.
  template <class Token>
  decltype(auto) async_try_acquire(Token&& token) {
    return E::async_try_acquire(*this, std::forward<Token>(token));
  }
  template <class Token>
  decltype(auto) async_acquire(std::optional<duration> timeout, Token&& token) {
    return E::async_acquire(*this, timeout, std::forward<Token>(token));
  }

  // Wraps `fn` so that each call runs it only if the lock is acquired (one try,
  // or waiting per `wait`), passing it the guard or its stop_token if it takes
  // one. The wrapper shares this mutex's state: it keeps working when the
  // mutex is moved or destroyed.
  template <class F>
  Singleton<BasicMutex, F> singleton(F fn, WaitPolicy wait = {}) {
    state_->add_owner();
    return Singleton<BasicMutex, F>(BasicMutex(state_), std::move(fn), wait);
  }

 private:
  friend struct detail::AsyncAccess;

  static BackendTraits traits_of(const B& backend) noexcept {
    if constexpr (BackendReportsCommitMode<B>) return BackendTraits{backend.heartbeat_commits_asynchronously()};
    else return BackendTraits{};
  }

  explicit BasicMutex(State* state) noexcept : state_(state) {}

  // The options are checked against what the backend tells (its commit mode)
  // before the backend moves into the state.
  static Result<State*> make_state(B&& backend, Options&& options, C&& clock, M&& metrics, E&& executor) {
    auto valid = validate(std::move(options), traits_of(backend));
    if (!valid) return tl::unexpected(std::move(valid.error()));
    return new State(std::move(*valid), std::move(backend), std::move(clock), std::move(metrics), std::move(executor));
  }

  // Everything lives here, at a stable address, shared by the mutex, its
  // guard, singleton wrappers and the executor's tasks.
  class State {
   public:
    using time_point = typename C::time_point;
    using Book = detail::GrantBook<time_point>;
    using executor_type = E;

    State(ValidOptions o, B b, C c, M m, E e)
        : options(std::move(o)), backend(std::move(b)), clock(std::move(c)), metrics(std::move(m)),
          executor(std::move(e)), book(options.lease(), traits_of(backend).heartbeat_commits_asynchronously),
          token_state_(std::random_device{}()) {
      token_state_ = (token_state_ << 32) ^ std::random_device{}();
    }

    State(const State&) = delete;
    State& operator=(const State&) = delete;

    ValidOptions options;
    [[no_unique_address]] B backend;
    [[no_unique_address]] C clock;
    [[no_unique_address]] M metrics;
    [[no_unique_address]] E executor;
    Book book;

    // ---- lifetime ---------------------------------------------------------
    // Owners (the mutex, a live guard, singleton wrappers) keep it open; when
    // the last one goes, wake-ups are cancelled. References (the owners as
    // one, plus each posted task) keep it allocated.

    PGMUTEX_ALWAYS_INLINE void add_owner() noexcept { owners_.add(); }
    PGMUTEX_ALWAYS_INLINE static void drop_owner(State* s) noexcept {
      if (!s->owners_.drop()) [[likely]]
        return;
      s->close();
      drop_reference(s);
    }

    // ---- operations ------------------------------------------------------

    Result<void> create_schema() {
      detail::IoLock io(io_gate_);
      if (!io) return reentered();
      return with_context(backend.create_schema(options.table));
    }

    Result<std::optional<LockRow>> inspect() {
      detail::IoLock io(io_gate_);
      if (!io) return reentered();
      return with_context(backend.inspect(lock_ref()));
    }

    // The statements under io_gate_, then (the gate left) the book and the hooks.
    Result<guard_type> try_acquire() {
      announce_if_expired();  // a grant held past its deadline is over: said so before a new one begins
      return finish(locked_attempt());
    }

    Result<guard_type> acquire(std::optional<duration> timeout, std::stop_token stop) {
      const time_point start = clock.now();
      for (;;) {
        auto attempt = try_acquire();
        const bool transient = !attempt && (attempt.error() == Errc::backend_unavailable ||
                                            attempt.error() == Errc::outcome_unknown);
        if (!attempt && !transient) return attempt;
        if (attempt && *attempt) return attempt;

        duration wait = BackendWatchesLocks<B> ? watch_without_timeout : options.poll_interval;
        if (timeout) {
          const duration left = *timeout - std::chrono::duration_cast<duration>(clock.now() - start);
          if (left <= duration::zero()) {
            if (!attempt) return attempt;  // the backend never answered: say so, not "timeout"
            return guard_type(Errc::timeout, std::move(attempt->holder_));
          }
          wait = std::min(wait, left);
        }
        if (stop.stop_requested()) return guard_type(Errc::cancelled, attempt ? std::move(attempt->holder_) : std::nullopt);
        bool waited = false;
        if constexpr (BackendWatchesLocks<B>) {
          // A backend that hears of every release for all its waiters at
          // once: sleep until it says the lock may be free (a release, the
          // holder's stale deadline, a re-check), not one poll_interval.
          const bool grace = attempt && attempt->holder() && attempt->holder()->failover_grace_left_s > 0;
          if (attempt && !grace) {
            const duration limit = timeout ? wait : watch_without_timeout;
            auto woke = backend.wait_until_free(watch_of(*attempt), limit, stop);
            if (stop.stop_requested()) return guard_type(Errc::cancelled, std::move(attempt->holder_));
            waited = woke.has_value();
          }
        } else if constexpr (BackendWaitsForRelease<B>) {
          // Refused by a failover grace: no release will come, and a backend
          // that polls would see the lock free at once: sleep through it.
          const bool grace = attempt && attempt->holder() && attempt->holder()->failover_grace_left_s > 0;
          if (!grace) {
            detail::IoLock io(io_gate_);
            if (!io) return reentered();
            waited = backend.wait_for_release(lock_ref(), wait).has_value();
          }
        }
        // No way to be told of a release, or it failed just now: sleep through the poll interval.
        if (!waited && executor.wait_for(std::min(wait, options.poll_interval), stop))
          return guard_type(Errc::cancelled, attempt ? std::move(attempt->holder_) : std::nullopt);
      }
    }

    Result<void> release_current() {
      const auto current = book.held_generation();
      if (!current) return fail(Errc::lock_not_held, context() + " is not held through this object");
      return release_grant(*current);
    }

    Result<void> heartbeat_current() {
      const auto current = book.held_generation();
      if (!current) return fail(Errc::lock_not_held, context() + " is not held through this object");
      return heartbeat_grant(*current);
    }

    // What a waiter knows of the holder its last try met.
    WatchRequest watch_of(const guard_type& refused) const {
      WatchRequest w{lock_ref(), options.stale_threshold, std::nullopt};
      if (refused.holder())
        w.holder_stale_in = std::max(duration::zero(), options.stale_threshold - age(refused.holder()->seconds_since_heartbeat));
      return w;
    }

    // Some thread is inside a statement of this mutex (see IoGate::busy).
    bool io_busy() const noexcept { return io_gate_.busy(); }

    // ---- what the guard calls --------------------------------------------

    // Each read compares the clock with the lease deadline now (DESIGN.md,
    // rule 4): a paused process never reads a stale "held".
    bool grant_lost(std::uint64_t which) const noexcept { return book.lost(which, clock.now()); }
    bool grant_holds(std::uint64_t which) const noexcept { return book.holds(which, clock.now()); }
    std::stop_token grant_stop_token(std::uint64_t which) {
      announce_if_expired();
      return book.stop_token(which);
    }

    // A manual heartbeat, on the caller's thread. A stop callback it runs may
    // release the last owner (a guard that outlived its mutex): the state
    // stays allocated until this call is done.
    Result<void> heartbeat_grant(std::uint64_t which) {
      add_reference();
      Result<void> result = heartbeat_grant_referenced(which);
      drop_reference(this);
      return result;
    }

    Result<void> heartbeat_grant_referenced(std::uint64_t which) {
      announce_if_expired();
      const auto grant = book.beat_grant(which, clock.now());
      if (!grant) return fail(Errc::lock_not_held, context() + ": " + grant.error().detail);
      Result<void> answer = beat(*grant, /*automatic=*/false);
      if (!answer && answer.error() != Errc::lock_not_held) return answer;
      if (!answer) return fail(Errc::lock_not_held, context() + ": " + book.lost_reason().message());
      return {};
    }

    Result<void> release_grant(std::uint64_t which) {
      announce_if_expired();
      auto ended = book.end(which);
      if (!ended) {
        book.forget(which);  // its guard is going: no one will ask how it ended
        return fail(Errc::lock_not_held, context() + " grant already ended");
      }
      // A pending wake-up stays: it finds nothing held and ends, and keeps
      // acquire/release cycles free of executor work.
      const HolderKey key = holder_key(ended->grant);
      Result<void> deleted;
      if (detail::IoLock io(io_gate_); !io) [[unlikely]] {
        deleted = reentered();
      } else {
        deleted = backend.release(key);
        // Transient failures are retried; other errors end it.
        for (int attempt = 1; !deleted && attempt < release_attempts; ++attempt) {
          if (deleted.error() != Errc::backend_unavailable && deleted.error() != Errc::outcome_unknown) break;
          deleted = backend.release(key);
          if (!deleted && deleted.error() == Errc::lock_not_held) {
            // A retry after an unknown outcome finds the row gone: the first delete landed.
            deleted = {};
            break;
          }
        }
      }
      if (deleted) [[likely]] {
        call_released(metrics, options.lock_name, options.instance_id);
        return {};
      }
      if (deleted.error() == Errc::backend_unavailable || deleted.error() == Errc::outcome_unknown) {
        // Our row may still be there: deleted by its token at the next
        // contact, not left to go stale. Never adopted again: a grant that was
        // released keeps its fence to itself, and the next gets a higher one.
        if (detail::IoLock io(io_gate_); io) unreleased_.push_back(key.token);
      }
      if (ended->was_lost && deleted.error() == Errc::lock_not_held)
        return fail(Errc::lock_not_held, context() + " was lost before release: " + book.lost_reason().message());
      return with_context(std::move(deleted));
    }

    // The guard's reference: an owner, like the mutex.
    friend guard_type;

   private:
    static constexpr int release_attempts = 3;
    // A watching backend wakes a waiter when the lock may be free; without a
    // timeout, the waiter still looks again this often.
    static constexpr duration watch_without_timeout = std::chrono::hours(1);
    static constexpr std::chrono::milliseconds retry_base{100};

    ~State() {
      // Every owner is gone: no grant is held (a guard releases before it goes).
      // A row that an acquire in doubt may have left is ours to remove.
      if (detail::IoLock io(io_gate_); io) clean_up_rows_in_doubt();
    }

    PGMUTEX_ALWAYS_INLINE void add_reference() noexcept { references_.add(); }
    PGMUTEX_ALWAYS_INLINE static void drop_reference(State* s) noexcept {
      if (s->references_.drop()) delete s;
    }

    // The last owner went: no wake-up may run from now on. cancel() waits for
    // a wake-up that is running; it may have posted a task, which holds its
    // own reference.
    // Posted tasks that have not started yet find it closed and do nothing;
    // running ones are waited for, unless this is one of them, so that no
    // hook or statement of this mutex runs after its last owner went. A
    // heartbeat is bounded by its timeout; a stop callback or hook is the
    // user's, waited for as std::stop_callback's destructor waits for one.
    void close() noexcept {
      std::vector<Wakeup> pending;
      {
        detail::LightLock lock(wakeup_mutex_);
        closing_ = true;
        closed_.store(true, std::memory_order_release);
        pending.swap(wakeups_);
      }
      for (const Wakeup& w : pending) executor.cancel(w.task);
      const int own = running_here() ? 1 : 0;
      for (int n = running_.load(std::memory_order_acquire); n > own; n = running_.load(std::memory_order_acquire))
        running_.wait(n, std::memory_order_acquire);
    }

    // Whether this thread is inside a posted task of this state.
    bool running_here() const noexcept { return current_task_state() == this; }
    static const State*& current_task_state() noexcept {
      static thread_local const State* state = nullptr;
      return state;
    }

    tl::unexpected<Error> reentered() const {
      return fail(Errc::backend_error, context() + ": called from inside a statement of the same mutex on this thread "
                                                   "(a simulation runs tasks inside a hung statement)");
    }

    LockRef lock_ref() const noexcept { return LockRef{options.table, options.lock_name}; }
    HolderKey holder_key(const typename Book::Grant& g) const noexcept {
      return HolderKey{lock_ref(), options.instance_id, g.fence, g.token, options.heartbeat_timeout, g.durable};
    }
    std::string context() const { return "lock '" + options.lock_name + "'"; }

    template <class T>
    Result<T> with_context(Result<T>&& r) const {
      if (!r) r.error().detail = context() + (r.error().detail.empty() ? "" : ": " + r.error().detail);
      return std::move(r);
    }

    static duration since_epoch(time_point t) noexcept {
      return std::chrono::duration_cast<duration>(t.time_since_epoch());
    }

    static duration age(double seconds) {
      return std::chrono::duration_cast<duration>(std::chrono::duration<double>(seconds));
    }

    // ---- acquiring: the statements under io_gate_, the hooks after ---------

    // What one try came to, and the hooks it owes, fired once io_gate_ is
    // left. Built only by the named makers below, each setting what its
    // outcome needs: a try is on every poll's path, and zeroing a large
    // record per try shows in the cycle's cost.
    struct Attempt {
      enum class Kind : unsigned char { won, taken, failed };
      Kind kind;
      bool alert;
      Fence fence;
      GrantToken token;
      time_point sent;
      double age_s;
      double grace_left_s;            // taken: > 0 if refused by a failover grace (who: "(failover grace)")
      detail::ServerSession session;  // won: the server session that granted it
      std::string who;             // won by reclaim: the previous holder; taken: the holder
      std::optional<Error> error;  // failed: why

      static Attempt won(Fence f, GrantToken t, time_point at, detail::ServerSession session, std::string previous = {}) {
        return Attempt(Kind::won, false, f, t, at, 0, 0, session, std::move(previous), std::nullopt);
      }
      static Attempt taken(std::string holder, Fence f, double age, bool alert, double grace_left = 0) {
        return Attempt(Kind::taken, alert, f, 0, {}, age, grace_left, {}, std::move(holder), std::nullopt);
      }
      static Attempt failed(Error e) { return Attempt(Kind::failed, false, 0, 0, {}, 0, 0, {}, {}, std::move(e)); }

     private:
      // A constructor, not aggregate initialization: GCC clears a whole
      // aggregate (padding included) with `rep stos` before filling it in.
      Attempt(Kind k, bool a, Fence f, GrantToken t, time_point at, double age, double grace, detail::ServerSession s,
              std::string w, std::optional<Error> e)
          : kind(k), alert(a), fence(f), token(t), sent(at), age_s(age), grace_left_s(grace), session(s), who(std::move(w)),
            error(std::move(e)) {}
    };

    Attempt locked_attempt() {
      detail::IoLock io(io_gate_);
      if (!io) return Attempt::failed(reentered().value());
      return try_acquire_io();
    }

    // Called with io_gate_ held.
    Attempt try_acquire_io() {
      if (const time_point now = clock.now(); book.holds(now)) {
        const auto g = book.current(now);
        return Attempt::failed(Error(Errc::already_acquired, context() + " is already held through this object (fence " +
                                                                 std::to_string(g ? g->fence : 0) +
                                                                 "); release it before acquiring again"));
      }
      for (int tries = 0; tries < 2; ++tries) {
        const GrantToken token = next_token();
        const time_point sent = clock.now();
        auto outcome = backend.try_acquire(
            AcquireRequest{lock_ref(), options.instance_id, options.stale_threshold, token, options.heartbeat_timeout});
        if (outcome) {
          if (outcome->acquired) [[likely]]
            return Attempt::won(outcome->fence, token, sent, session_of_last(),
                                outcome->reclaimed ? std::move(outcome->holder) : std::string());
          // Our own row, created by an earlier acquire whose reply was lost:
          // its lease counts from the row's last heartbeat, not from now.
          if (is_in_doubt(outcome->holder_token)) return adopt(outcome->fence, outcome->holder_token, sent, outcome->holder_age_s);
          // Our own row, whose release failed: delete it, then try again.
          if (is_unreleased(outcome->holder_token) && delete_ours(outcome->fence, outcome->holder_token)) continue;
          // Nobody holds it, but a server promoted after a failover waits
          // out the leases the old primary may have granted: no alert.
          if (outcome->failover_grace_left_s > 0) [[unlikely]]
            return Attempt::taken(std::move(outcome->holder), 0, 0, false, outcome->failover_grace_left_s);
          return contended(std::move(outcome->holder), outcome->fence, outcome->holder_age_s);
        }
        if (outcome.error() != Errc::outcome_unknown)
          return Attempt::failed(with_context<void>(tl::unexpected(std::move(outcome.error()))).error());
        // The reply was lost: read the row back rather than guess. The token
        // says whether it is ours, never the instance_id (two objects may share one).
        in_doubt_.push_back(token);
        auto row = backend.inspect(lock_ref());
        if (!row) {
          // Still unknown: if our row did land, the next contact finds it by its token.
          return Attempt::failed(
              Error(Errc::outcome_unknown, context() + ": acquire reply lost and read-back failed: " + row.error().message()));
        }
        if (*row && is_in_doubt((*row)->token))
          return adopt((*row)->fence, (*row)->token, sent, (*row)->seconds_since_heartbeat);
        if (*row) return contended((*row)->instance_id, (*row)->fence, (*row)->seconds_since_heartbeat);
        // Nothing landed and nobody holds the lock: one more try says which.
      }
      return Attempt::failed(Error(Errc::outcome_unknown, context() + ": two acquires in a row lost their replies"));
    }

    Attempt adopt(Fence fence, GrantToken token, time_point sent, double age_s) {
      std::erase(in_doubt_, token);
      return Attempt::won(fence, token, sent - age(age_s), session_of_last());
    }

    Attempt contended(std::string holder, Fence holder_fence, double age_s) {
      // Alert once per holder and fence.
      bool alert = false;
      if (age_s >= std::chrono::duration<double>(options.alert_threshold).count() &&
          !(alerted_fence_ == holder_fence && alerted_holder_ == holder)) {
        alerted_holder_ = holder;
        alerted_fence_ = holder_fence;
        alert = true;
      }
      return Attempt::taken(std::move(holder), holder_fence, age_s, alert);
    }

    // Outside every lock: the grant is entered in the book, the wake-up is
    // armed, and the hooks run.
    Result<guard_type> finish(Attempt a) {
      if (a.kind == Attempt::Kind::failed) [[unlikely]]
        return tl::unexpected(std::move(*a.error));
      if (a.kind == Attempt::Kind::taken) {
        call_contended(metrics, options.lock_name, options.instance_id);
        if (a.alert) call_alert(metrics, options.lock_name, a.who, a.age_s);
        return guard_type(Errc::lock_held, HolderInfo{std::move(a.who), a.fence, a.age_s, a.grace_left_s});
      }
      const time_point now = clock.now();
      const std::uint64_t generation = book.begin(a.fence, a.token, a.sent, now + options.heartbeat_interval, a.session);
      arm_wakeup(std::min(now + options.heartbeat_interval, a.sent + options.lease()));
      if (!a.who.empty()) call_stale_reclaimed(metrics, options.lock_name, options.instance_id, a.who);
      call_acquired(metrics, options.lock_name, options.instance_id, a.fence);
      call_lease_renewed(metrics, options.lock_name, options.instance_id, since_epoch(a.sent + options.lease()));
      call_acquire_latency(metrics, options.lock_name, options.instance_id,
                           std::chrono::duration<double>(now - a.sent).count());
      add_owner();
      return guard_type(this, generation, a.fence);
    }

    // Called with io_gate_ held: the server session and history of the last statement.
    detail::ServerSession session_of_last() const noexcept {
      detail::ServerSession at;
      if constexpr (BackendReportsSession<B>) at.session = backend.session();
      if constexpr (BackendReportsHistory<B>) at.history = backend.history();
      if constexpr (BackendReportsDurability<B>) at.durability = backend.last_heartbeat_durability();
      return at;
    }

    bool is_unreleased(GrantToken token) const noexcept {
      return token != 0 && !unreleased_.empty() && std::ranges::find(unreleased_, token) != unreleased_.end();
    }

    // Called with io_gate_ held: deletes our row of a grant whose release
    // failed. True if it is gone now.
    bool delete_ours(Fence fence, GrantToken token) {
      auto deleted = backend.release(HolderKey{lock_ref(), options.instance_id, fence, token, options.heartbeat_timeout});
      if (!deleted && deleted.error() != Errc::lock_not_held) return false;
      std::erase(unreleased_, token);
      return true;
    }

    bool is_in_doubt(GrantToken token) const noexcept {
      return token != 0 && !in_doubt_.empty() && std::ranges::find(in_doubt_, token) != in_doubt_.end();
    }

    // Called with io_gate_ held: rows that acquires in doubt created after
    // all, found by their tokens and removed.
    void clean_up_rows_in_doubt() noexcept {
      if (in_doubt_.empty() && unreleased_.empty()) return;
      auto row = backend.inspect(lock_ref());
      if (row && *row && (is_in_doubt((*row)->token) || is_unreleased((*row)->token)))
        (void)backend.release(HolderKey{lock_ref(), options.instance_id, (*row)->fence, (*row)->token,
                                        options.heartbeat_timeout});
      if (row) {
        in_doubt_.clear();
        unreleased_.clear();
      }
    }

    // A fresh random token for each attempt: never 0 (0 is "no token").
    GrantToken next_token() noexcept {
      for (;;) {
        // splitmix64: cheap, and seeded from the OS per mutex.
        std::uint64_t z = (token_state_ += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        if (z != 0) return z;
      }
    }

    // ---- the heartbeat: a statement with no internal lock but io_gate_ -----

    // One heartbeat of grant `g`, on this thread; what its answer means goes
    // into the book, and loss is announced once no lock is held.
    Result<void> beat(const typename Book::Grant& g, bool automatic) {
      Result<void> answer;
      detail::ServerSession session;
      time_point sent = clock.now();
      if (detail::IoLock io(io_gate_); !io) [[unlikely]] {
        answer = reentered();
      } else {
        sent = clock.now();  // after any wait for io_gate_: when the statement really goes out
        answer = backend.heartbeat(holder_key(g));
        session = session_of_last();
      }
      return note_beat(g, sent, std::move(answer), session, automatic, /*announce_here=*/true);
    }

    // What the answer to a heartbeat means, into the book; the next wake-up
    // armed; the hooks run. A lost lease is announced here, or posted when
    // this runs on a backend's thread that must not wait for a stop callback.
    Result<void> note_beat(const typename Book::Grant& g, time_point sent, Result<void> answer,
                           detail::ServerSession session, bool automatic, bool announce_here) {
      const time_point now = clock.now();
      auto applied = book.apply_beat(g, sent, now, answer, automatic, options.heartbeat_interval, retry_base, session);
      if (applied.next_wakeup) arm_wakeup(*applied.next_wakeup);
      if (applied.renewed) call_lease_renewed(metrics, options.lock_name, options.instance_id, since_epoch(*applied.renewed));
      if (answer) {
        call_heartbeat_latency(metrics, options.lock_name, options.instance_id,
                               std::chrono::duration<double>(now - sent).count());
      } else if (answer.error() != Errc::lock_not_held) {
        call_heartbeat_failed(metrics, options.lock_name, options.instance_id, answer.error());
      }
      if (applied.lost) {
        if (announce_here) announce_lost(std::move(*applied.lost));
        else post_lost(std::move(*applied.lost), /*may_announce_here=*/false);
      }
      return with_context(std::move(answer));
    }

    // The automatic heartbeat through a backend that batches it: no thread
    // of the executor waits for it. The reply comes on the backend's thread;
    // like a posted task, it does nothing once the last owner went.
    // (A body only for such backends: an explicit instantiation compiles every member.)
    void start_async_beat([[maybe_unused]] const typename Book::Grant& g) {
      if constexpr (BackendBeatsAsynchronously<B>) {
        add_reference();
        const time_point sent = clock.now();
        bool taken = false;
        try {
          taken = backend.heartbeat_async(holder_key(g), [this, g, sent](BeatReply reply) {
            run_as_task([&] {
              (void)note_beat(g, sent, std::move(reply.result), detail::ServerSession{reply.session, reply.history, reply.durability},
                              /*automatic=*/true, /*announce_here=*/false);
            });
            drop_reference(this);
          });
        } catch (...) {  // no memory for the callback
        }
        if (!taken) {  // the callback will never run: its reference goes now
          drop_reference(this);
          beat_not_started();
        }
      }
    }

    // Runs `fn` as a task of this state: not once closed, and close() waits for it.
    template <class F>
    void run_as_task(F&& fn) {
      if (closed_.load(std::memory_order_acquire)) return;
      running_.fetch_add(1, std::memory_order_acq_rel);
      const State* outer = std::exchange(current_task_state(), this);
      fn();
      current_task_state() = outer;
      running_.fetch_sub(1, std::memory_order_acq_rel);
      running_.notify_all();
    }

    // Stops the grant's token (running its stop callbacks) and runs the lost
    // hook: user code, so never under a lock of ours.
    void announce_lost(detail::LostNotice notice) {
      if (notice.stop) notice.stop->request_stop();
      call_lost(metrics, options.lock_name, options.instance_id, notice.reason);
    }

    // A lease whose deadline passed before the timer said so (a paused
    // process, a late timer thread) is declared lost now, and announced off
    // this thread, before anything acts on the grant.
    void announce_if_expired() {
      if (auto notice = book.expire(clock.now()))
        post_lost(std::move(*notice), /*may_announce_here=*/true);
    }

    // Runs `fn` on the executor's I/O side, keeping this state alive meanwhile.
    template <class F>
    void post(F fn) {
      add_reference();
      try {
        executor.post([this, fn = std::move(fn)]() mutable {
          run_as_task(fn);
          drop_reference(this);
        });
      } catch (...) {
        drop_reference(this);  // no thread or memory for it
        beat_not_started();
      }
    }

    // Announces a lost lease off this thread (a stop callback may block). A
    // post is all or nothing: if it throws (no memory), the task will never
    // run, so the notice is announced here when this thread may wait for a
    // stop callback (the timer's, or the caller's), else kept for the next
    // wake-up: late rather than never.
    void post_lost(detail::LostNotice notice, bool may_announce_here) {
      add_reference();
      try {
        executor.post([this, notice]() mutable {  // a copy: ours stays whole if the post throws
          run_as_task([&] { announce_lost(std::move(notice)); });
          drop_reference(this);
        });
        return;
      } catch (...) {
        drop_reference(this);
      }
      if (may_announce_here) return announce_lost(std::move(notice));
      {
        detail::LightLock lock(wakeup_mutex_);
        unannounced_ = std::move(notice);
      }
      try {
        arm_wakeup(clock.now() + retry_base);
      } catch (...) {  // no memory for a timer: the next wake-up announces it
      }
    }

    std::optional<detail::LostNotice> take_unannounced() noexcept {
      detail::LightLock lock(wakeup_mutex_);
      return std::exchange(unannounced_, std::nullopt);
    }

    // A beat that could not go out is tried again soon, not at the lease deadline.
    void beat_not_started() noexcept {
      try {
        arm_wakeup(book.beat_not_started(clock.now() + retry_base));
      } catch (...) {  // no memory for a timer: the lease deadline's wake-up, armed already, still comes
      }
    }

    // ---- the wake-up: the lease timer and the heartbeat's cadence -----------
    // A timer task that does no I/O: at the lease deadline it declares the
    // lease lost, whatever any statement is doing; when a beat is due it
    // posts the beat. A wake-up no longer needed finds nothing to do and ends.

    // Makes sure a wake-up comes by `due`.
    void arm_wakeup(time_point due) {
      detail::LightLock lock(wakeup_mutex_);
      if (closing_) return;
      for (const Wakeup& w : wakeups_)
        if (!w.running && w.due <= due) return;
      const std::uint64_t id = ++last_wakeup_;
      const auto delay = std::max(duration::zero(), std::chrono::duration_cast<duration>(due - clock.now()));
      wakeups_.reserve(wakeups_.size() + 1);  // may throw before anything is scheduled, not after
      const TaskId task = executor.schedule_after(delay, [this, id] { on_wakeup(id); });
      wakeups_.push_back(Wakeup{id, task, due, false});
    }

    // The entry stays (marked running) until the wake-up is done, so that a
    // close() meanwhile cancels it, which waits for it to finish.
    void on_wakeup(std::uint64_t id) {
      {
        detail::LightLock lock(wakeup_mutex_);
        if (closing_) return;
        for (Wakeup& w : wakeups_)
          if (w.id == id) w.running = true;
      }
      auto due = book.on_timer(clock.now());
      if (due.next_wakeup) arm_wakeup(*due.next_wakeup);
      if (due.beat) {
        if constexpr (BackendBeatsAsynchronously<B>) start_async_beat(*due.beat);
        else post([this, g = *due.beat] { (void)beat(g, /*automatic=*/true); });
      }
      // Off the timer: a stop callback may block, and other locks' deadlines must not wait for it.
      if (due.lost) post_lost(std::move(*due.lost), /*may_announce_here=*/true);
      if (auto late = take_unannounced()) post_lost(std::move(*late), /*may_announce_here=*/true);
      detail::LightLock lock(wakeup_mutex_);
      std::erase_if(wakeups_, [id](const Wakeup& w) { return w.id == id; });
    }

    struct Wakeup {
      std::uint64_t id;
      TaskId task;
      time_point due;
      bool running;
    };

    // Serializes statements: a backend connection never serves two threads.
    // Held across I/O, so the book, the wake-ups and the guard never take it.
    detail::IoGate io_gate_;
    std::vector<GrantToken> in_doubt_;    // tokens of acquires whose outcome is unknown (io_gate_)
    std::vector<GrantToken> unreleased_;  // tokens of grants whose release failed (io_gate_)
    std::uint64_t token_state_;         // (io_gate_)
    std::string alerted_holder_;        // (io_gate_)
    Fence alerted_fence_ = -1;          // (io_gate_)

    detail::LightMutex wakeup_mutex_;  // held briefly; never across a task
    std::vector<Wakeup> wakeups_;      // pending wake-ups: one, but for a moment after a re-grant
    std::uint64_t last_wakeup_ = 0;
    bool closing_ = false;
    std::optional<detail::LostNotice> unannounced_;  // a lost lease that could not be posted (wakeup_mutex_)
    std::atomic<bool> closed_{false};  // closing_, for posted tasks that must not take wakeup_mutex_
    std::atomic<int> running_{0};      // posted tasks running now

    detail::LightRefCount owners_{1};
    detail::LightRefCount references_{1};
  };

  State* state_;
  guard_type locked_;  // the grant lock()/try_lock() took (public section: Lockable)
};

}  // namespace pgmutex
