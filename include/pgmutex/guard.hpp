// The RAII guard a mutex's acquire returns. It converts to true when the lock
// was granted, releases the grant when it goes out of scope, and tells when
// the lease was lost (lost(), and a stop_token that is stopped then).
#pragma once

#include <cstdint>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>

#include "pgmutex/backend.hpp"
#include "pgmutex/error.hpp"

namespace pgmutex {

namespace detail {
struct AsyncAccess;  // see basic_mutex.hpp
struct AcquireWait;  // see detail/acquire_wait.hpp
struct QueueWait;    // see detail/queue_wait.hpp
struct ElectionAccess;  // see leadership.hpp
}  // namespace detail

// Who held the lock when an acquire did not get it.
struct HolderInfo {
  std::string instance_id;
  Fence fence = 0;
  double seconds_since_heartbeat = 0.0;
  // > 0: nobody holds it, but the server, promoted after a failover, grants
  // nothing that looks free or stale for this many more seconds (see
  // AcquireResult::failover_grace_left_s); instance_id is "(failover grace)".
  double failover_grace_left_s = 0.0;
};

template <class State>
class BasicGuard {
 public:
  BasicGuard() = default;
  BasicGuard(BasicGuard&& other) noexcept
      : state_(std::exchange(other.state_, nullptr)),
        generation_(other.generation_),
        fence_(other.fence_),
        why_(other.why_),
        holder_(std::move(other.holder_)) {}
  BasicGuard& operator=(BasicGuard&& other) noexcept {
    if (this != &other) {
      reset();
      state_ = std::exchange(other.state_, nullptr);
      generation_ = other.generation_;
      fence_ = other.fence_;
      why_ = other.why_;
      holder_ = std::move(other.holder_);
    }
    return *this;
  }
  BasicGuard(const BasicGuard&) = delete;
  BasicGuard& operator=(const BasicGuard&) = delete;
  ~BasicGuard() { reset(); }

  // True while this guard holds the lock: acquired, not released, and the
  // lease not lost. Never waits for I/O.
  explicit operator bool() const noexcept { return state_ != nullptr && state_->grant_holds(generation_); }
  // True while this guard owns its grant: acquired and not yet released. A
  // lost lease still owns its grant (the destructor releases it): see lost().
  [[nodiscard]] bool owns_lock() const noexcept { return state_ != nullptr; }

  // The fencing token of this grant: strictly increasing per lock. Pass it to
  // the resource you protect and have it reject lower ones.
  [[nodiscard]] Fence fence() const noexcept { return fence_; }

  // True once the lease is lost (watchdog expired, or the row was taken over).
  // Never waits for I/O.
  [[nodiscard]] bool lost() const noexcept { return state_ != nullptr && state_->grant_lost(generation_); }

  // Stopped when the lease is lost. Long work polls it, or registers a std::stop_callback.
  [[nodiscard]] std::stop_token stop_token() const {
    return state_ != nullptr ? state_->grant_stop_token(generation_) : std::stop_token{};
  }

  // Why this guard is empty: Errc::lock_held, Errc::timeout or Errc::cancelled.
  [[nodiscard]] Errc why() const noexcept { return why_; }
  // Who held the lock at the last try, when this guard is empty because of them.
  [[nodiscard]] const std::optional<HolderInfo>& holder() const noexcept { return holder_; }

  // A heartbeat now, besides the automatic ones. Errc::lock_not_held once lost.
  Result<void> heartbeat(nothrow_t) {
    if (state_ == nullptr) return fail(Errc::lock_not_held, "guard does not own a lock");
    return state_->heartbeat_grant(generation_);
  }
  void heartbeat() { value_or_throw(heartbeat(nothrow)); }

  // Release now. Errc::lock_not_held if the row was no longer ours (lease lost).
  Result<void> release(nothrow_t) {
    if (state_ == nullptr) return fail(Errc::lock_not_held, "guard does not own a lock");
    State* state = std::exchange(state_, nullptr);
    auto released = state->release_grant(generation_);
    State::drop_owner(state);  // the guard's share: the mutex itself may be gone
    return released;
  }
  void release() { value_or_throw(release(nothrow)); }

  // ---- Async forms: where the mutex's executor policy provides them
  // (AsioExecutor, <pgmutex/asio.hpp>). async_release takes the grant out of
  // this guard at once, as release() does; unlike release(), it completes
  // with success when the lease was lost (nothing is left to release, and
  // lost() said so already: read it before the call), so that a coroutine
  // need not catch it to go on; an empty guard is still lock_not_held.
  // async_wait_lost completes when the lease is lost (never if it is
  // released first: cancel it then).
  template <class Token>
  decltype(auto) async_release(Token&& token) {
    return State::executor_type::async_release(std::move(*this), std::forward<Token>(token));
  }
  template <class Token>
  decltype(auto) async_heartbeat(Token&& token) {
    return State::executor_type::async_heartbeat(*this, std::forward<Token>(token));
  }
  template <class Token>
  decltype(auto) async_wait_lost(Token&& token) {
    return State::executor_type::async_wait_lost(*this, std::forward<Token>(token));
  }

 private:
  friend State;
  friend struct detail::AsyncAccess;
  friend struct detail::AcquireWait;
  friend struct detail::QueueWait;
  friend struct detail::ElectionAccess;

  BasicGuard(State* state, std::uint64_t generation, Fence fence) noexcept
      : state_(state), generation_(generation), fence_(fence) {}
  BasicGuard(Errc why, std::optional<HolderInfo> holder) noexcept : why_(why), holder_(std::move(holder)) {}

  // release(), by a leadership's resign: the statement also vacates the
  // grant's term (MutexState::release_grant<true>). Apart from release(),
  // so that a plain guard's code stays what it was; a template, so that a
  // guard of a backend that keeps no elections never compiles it (not even
  // in an explicit instantiation).
  template <bool Vacate = true>
  Result<void> release_vacating() {
    if (state_ == nullptr) return fail(Errc::lock_not_held, "guard does not own a lock");
    State* state = std::exchange(state_, nullptr);
    auto released = state->template release_grant<Vacate>(generation_);
    State::drop_owner(state);
    return released;
  }

  void reset() noexcept {
    if (state_ != nullptr) (void)release(nothrow);
  }

  State* state_ = nullptr;
  std::uint64_t generation_ = 0;
  Fence fence_ = 0;
  Errc why_ = Errc::lock_held;
  std::optional<HolderInfo> holder_;
};

}  // namespace pgmutex
