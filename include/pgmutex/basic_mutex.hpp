// BasicMutex: one named lock in a lock table, over four policies.
//
//   Backend   the lock table (PostgresBackend, MemoryBackend, ...)
//   Clock     the client's monotonic time (cadence, waits, watchdog)
//   Metrics   hooks (any subset; absent ones cost nothing)
//   Executor  where the automatic heartbeat and timed waits run
//
// Every operation has an expected-returning form (pass pgmutex::nothrow) and a
// throwing form built on it. This file is the public face; the work is done by
// the shared state (detail/mutex_state.hpp), which coordinates three units of
// the execution model (DESIGN.md): the grant's bookkeeping (GrantBook), the
// lease timer (WakeupSchedule) and the I/O (LockStatements).
#pragma once

#include <chrono>
#include <concepts>
#include <optional>
#include <stop_token>
#include <string_view>
#include <utility>

#include "pgmutex/backend.hpp"
#include "pgmutex/clock.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/executor.hpp"
#include "pgmutex/detail/lockable.hpp"
#include "pgmutex/detail/mutex_state.hpp"
#include "pgmutex/guard.hpp"
#include "pgmutex/metrics.hpp"
#include "pgmutex/options.hpp"
#include "pgmutex/singleton.hpp"

namespace pgmutex {

namespace detail {
// Reaches a mutex's and a guard's shared state for an executor's async forms
// (defined with AsioExecutor, in pgmutex/asio/); nothing else uses it.
struct AsyncAccess;
// AnyMutex's model of a BasicMutex (any_mutex.hpp): its singletons share the state.
template <class Mutex>
class AnyMutexModel;

template <class E>
inline constexpr bool executor_given = false;

// Another backend for another lock of a mutex's: share() where the backend
// has it (the same pool or session), else a copy.
template <Backend B>
B share_backend(const B& backend) {
  if constexpr (BackendShares<B>) {
    return backend.share();
  } else {
    static_assert(std::copy_constructible<B>,
                  "a singleton under another lock name needs a backend that can be shared: give it "
                  "B share() const (another backend on the same pool or session), or a copy constructor");
    return backend;
  }
}
}  // namespace detail

// The message when an Executor policy without a default value is left out.
#define PGMUTEX_EXECUTOR_NOT_GIVEN                                                                              \
  "this mutex's Executor policy (e.g. AsioExecutor) has no default value: pass the executor, the fifth "     \
  "argument: AsioMutex(session->backend(), options, {}, {}, pgmutex::AsioExecutor(io.get_executor()))"

template <Backend B, Clock C = SteadyClock, Metrics M = NoMetrics, Executor E = ThreadExecutor>
class BasicMutex {
  // Everything lives there, at a stable address, shared by the mutex, its
  // guards, singleton wrappers and the executor's tasks.
  using State = detail::MutexState<B, C, M, E>;

 public:
  using backend_type = B;
  using clock_type = C;
  using metrics_type = M;
  using executor_type = E;
  using guard_type = BasicGuard<State>;
  using duration = std::chrono::nanoseconds;

  // Throws InvalidArgumentError naming the option and the rule it breaks.
  BasicMutex(B backend, Options options, C clock, M metrics, E executor)
      : state_(value_or_throw(make_state(std::move(backend), std::move(options), std::move(clock), std::move(metrics),
                                         std::move(executor)))) {}
  // The executor left out: only an Executor policy with a default value
  // (ThreadExecutor) may be. AsioExecutor names the user's loop, so an
  // AsioMutex is given it: AsioMutex(backend, options, {}, {}, AsioExecutor(io.get_executor())).
  BasicMutex(B backend, Options options, C clock = {}, M metrics = {})
    requires std::default_initializable<E>
      : BasicMutex(std::move(backend), std::move(options), std::move(clock), std::move(metrics), E{}) {}
  template <class Missing = E>
    requires(!std::default_initializable<Missing>)
  BasicMutex(B, Options, C = {}, M = {}) : state_(nullptr) {
    static_assert(detail::executor_given<Missing>, PGMUTEX_EXECUTOR_NOT_GIVEN);
  }

  static Result<BasicMutex> create(B backend, Options options, C clock, M metrics, E executor) {
    auto state = make_state(std::move(backend), std::move(options), std::move(clock), std::move(metrics),
                            std::move(executor));
    if (!state) return tl::unexpected(std::move(state.error()));
    return BasicMutex(*state);
  }
  static Result<BasicMutex> create(B backend, Options options, C clock = {}, M metrics = {})
    requires std::default_initializable<E>
  {
    return create(std::move(backend), std::move(options), std::move(clock), std::move(metrics), E{});
  }
  template <class Missing = E>
    requires(!std::default_initializable<Missing>)
  static Result<BasicMutex> create(B, Options, C = {}, M = {}) {
    static_assert(detail::executor_given<Missing>, PGMUTEX_EXECUTOR_NOT_GIVEN);
    return fail(Errc::invalid_argument);
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
  PGMUTEX_ALWAYS_INLINE Result<guard_type> try_acquire(nothrow_t) { return state_->try_acquire(); }
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
    return Singleton<BasicMutex, F>(share(), std::move(fn), wait);
  }

  // The same, under a lock name given per call (the seed's
  // singleton(lock_name)): the wrapper's own mutex shares this one's backend
  // (the same pool or session: BackendShares, or a copy), options and
  // instance id, and copies of its clock, metrics and executor. A lock name
  // the options refuse is Errc::invalid_argument (InvalidArgumentError),
  // naming the name given and the rule it breaks.
  template <class F>
  Result<Singleton<BasicMutex, F>> singleton(nothrow_t, std::string_view lock_name, F fn, WaitPolicy wait = {}) {
    auto named = renamed(lock_name);
    if (!named) return tl::unexpected(std::move(named.error()));
    return Singleton<BasicMutex, F>(std::move(*named), std::move(fn), wait);
  }
  template <class F>
  Singleton<BasicMutex, F> singleton(std::string_view lock_name, F fn, WaitPolicy wait = {}) {
    return value_or_throw(singleton(nothrow, lock_name, std::move(fn), wait));
  }

  // ---- Async forms of create_schema and singleton, where the executor
  // policy provides them (AsioExecutor): see <pgmutex/asio/async_ops.hpp>.
  template <class Token>
  decltype(auto) async_create_schema(Token&& token) {
    return E::async_create_schema(*this, std::forward<Token>(token));
  }
  template <class F>
  auto async_singleton(F fn, WaitPolicy wait = {}) {
    return E::async_singleton(share(), std::move(fn), wait);
  }
  template <class F>
  auto async_singleton(nothrow_t, std::string_view lock_name, F fn, WaitPolicy wait = {}) {
    using Wrapper = decltype(E::async_singleton(std::declval<BasicMutex>(), std::move(fn), wait));
    auto named = renamed(lock_name);
    if (!named) return Result<Wrapper>(tl::unexpected(std::move(named.error())));
    return Result<Wrapper>(E::async_singleton(std::move(*named), std::move(fn), wait));
  }
  template <class F>
  auto async_singleton(std::string_view lock_name, F fn, WaitPolicy wait = {}) {
    return value_or_throw(async_singleton(nothrow, lock_name, std::move(fn), wait));
  }

 private:
  friend struct detail::AsyncAccess;
  template <class Mutex>
  friend class detail::AnyMutexModel;

  explicit BasicMutex(State* state) noexcept : state_(state) {}

  // A second mutex object on this one's state (a singleton wrapper's).
  BasicMutex share() noexcept {
    state_->add_owner();
    return BasicMutex(state_);
  }

  // A new mutex under another lock name, on a backend shared with this one.
  Result<BasicMutex> renamed(std::string_view lock_name) {
    auto options = detail::options_for_lock(state_->options, lock_name);
    if (!options) return tl::unexpected(std::move(options.error()));
    return create(detail::share_backend(state_->io.backend), std::move(*options), state_->clock, state_->metrics,
                  state_->executor);
  }

  // The options are checked against what the backend tells (its commit mode)
  // before the backend moves into the state.
  static Result<State*> make_state(B&& backend, Options&& options, C&& clock, M&& metrics, E&& executor) {
    auto valid = validate(std::move(options), detail::traits_of(backend));
    if (!valid) return tl::unexpected(std::move(valid.error()));
    return new State(std::move(*valid), std::move(backend), std::move(clock), std::move(metrics), std::move(executor));
  }

  State* state_;
  guard_type locked_;  // the grant lock()/try_lock() took (public section: Lockable)
};

}  // namespace pgmutex

#undef PGMUTEX_EXECUTOR_NOT_GIVEN  // expanded where the templates were defined
