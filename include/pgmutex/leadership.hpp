// What a campaign returns (pgmutex/election.hpp): the leadership of one
// term. It is a guard with a value: the term is the grant's fence, the
// watchdog and "lost before anyone else can lead" hold as for any guard, and
// the value is what this leader announced. Resigning (or the destructor)
// vacates the term first, so observers hear the vacancy, then releases the
// lock to the next in line. Used from one thread at a time, as a guard is.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>

#include "pgmutex/asio/access.hpp"  // detail::AsyncAccess: Asio-free, the door into a guard's state
#include "pgmutex/backend.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/guard.hpp"

namespace pgmutex {

namespace detail {

struct ElectionAccess;  // see election.hpp

// The holder of grant `which` announces `value` (elected or proclaimed), or
// vacates its term: one statement each, under the mutex's I/O gate, keyed by
// the grant as its heartbeat is. An announce is refused without a statement
// once the lease is over on this process's clock, checked again once the gate
// is ours (a hung statement before it may have outlasted the lease), and the
// server refuses one whose row went stale: a leader never announces past its
// lease. A vacate goes out whenever the grant is still owned, lost or not.
// The book notes what landed, under the gate: after a failover the state
// announces it again (GrantBook::note_announced).
template <class State>
Result<LeaderRecord> announce_grant(State& s, std::uint64_t which, std::string_view value) {
  const auto over = [&] { return fail(Errc::lock_not_held, s.io.context() + ": the term's lease is over"); };
  if (!s.grant_holds(which)) return over();
  auto grant = s.book.beat_grant(which, s.clock.now());
  if (!grant) return fail(Errc::lock_not_held, s.io.context() + ": " + grant.error().detail);
  return s.io.run([&](auto& backend) -> Result<LeaderRecord> {
    if (!s.grant_holds(which)) return over();
    auto announced = backend.announce(s.io.key_of(*grant), value);
    if (announced) s.book.note_announced(which, std::string(value));
    return announced;
  });
}

template <class State>
Result<LeaderRecord> vacate_grant(State& s, std::uint64_t which) {
  auto grant = s.book.owned(which);
  if (!grant) return fail(Errc::lock_not_held, s.io.context() + ": the term ended already");
  return s.io.run([&](auto& backend) {
    auto vacated = backend.vacate(s.io.key_of(*grant));
    if (vacated) s.book.note_vacated(which);
    return vacated;
  });
}

}  // namespace detail

template <class State>
class BasicLeadership {
 public:
  using guard_type = BasicGuard<State>;

  BasicLeadership() = default;
  BasicLeadership(BasicLeadership&&) noexcept = default;
  BasicLeadership& operator=(BasicLeadership&& other) noexcept {
    if (this != &other) {
      (void)resign(nothrow);
      guard_ = std::move(other.guard_);
      value_ = std::move(other.value_);
    }
    return *this;
  }
  BasicLeadership(const BasicLeadership&) = delete;
  BasicLeadership& operator=(const BasicLeadership&) = delete;
  ~BasicLeadership() { (void)resign(nothrow); }

  // True while this leads: elected, not resigned, the lease not lost. Never waits for I/O.
  explicit operator bool() const noexcept { return static_cast<bool>(guard_); }
  // The term: the grant's fence, strictly increasing across leaders of a
  // lock. Fence the leader's writes with it.
  [[nodiscard]] Fence term() const noexcept { return guard_.fence(); }
  // What this leader announced last (after an async_proclaim, once its handler runs).
  [[nodiscard]] const std::string& value() const noexcept { return value_ ? *value_ : no_value(); }
  // True once the lease is lost: the term is over before anyone else can lead.
  [[nodiscard]] bool lost() const noexcept { return guard_.lost(); }
  // Stopped when the lease is lost: stop serving then.
  [[nodiscard]] std::stop_token stop_token() const { return guard_.stop_token(); }
  // Why a campaign returned no leadership: Errc::timeout or Errc::cancelled.
  [[nodiscard]] Errc why() const noexcept { return guard_.why(); }
  [[nodiscard]] const std::optional<HolderInfo>& holder() const noexcept { return guard_.holder(); }
  // The guard underneath, for code that takes a guard (its fence() is term()).
  [[nodiscard]] const guard_type& guard() const noexcept { return guard_; }

  // Announces a new value within the term (observers are told). Refused with
  // Errc::invalid_argument for a value over max_election_value_bytes, and
  // with Errc::lock_not_held once the term is over; the value stays then.
  Result<void> proclaim(nothrow_t, std::string value) {
    State* state = detail::AsyncAccess::guard_state(guard_);
    if (state == nullptr) return fail(Errc::lock_not_held, "leadership holds no term");
    if (auto valid = validate_election_value(state->options.lock_name, value); !valid) return valid;
    auto announced = detail::announce_grant(*state, detail::AsyncAccess::generation(guard_), value);
    if (!announced) return tl::unexpected(std::move(announced.error()));
    *value_ = std::move(value);
    return {};
  }
  void proclaim(std::string value) { value_or_throw(proclaim(nothrow, std::move(value))); }

  // Vacates the term (observers are told nobody leads), then releases the
  // lock to the next in line. Errc::lock_not_held if the term was over
  // already (the lease lost): nothing is left to give up then.
  Result<void> resign(nothrow_t) {
    State* state = detail::AsyncAccess::guard_state(guard_);
    if (state == nullptr) return fail(Errc::lock_not_held, "leadership holds no term");
    auto vacated = detail::vacate_grant(*state, detail::AsyncAccess::generation(guard_));
    auto released = guard_.release(nothrow);  // whatever the vacate said: the next in line must not wait
    if (!released) return released;
    if (!vacated) return tl::unexpected(std::move(vacated.error()));
    return {};
  }
  void resign() { value_or_throw(resign(nothrow)); }

  // ---- Async forms: where the executor policy provides them (AsioExecutor,
  // <pgmutex/asio.hpp>), each completing with void(error_code).
  // async_proclaim announces `value`; value() returns it once the handler
  // runs (on the handler's executor). async_resign takes the term out of
  // this leadership at once, as resign() does; like the guard's
  // async_release, it completes with success when the lease was lost
  // (lost() said so already); an empty leadership is lock_not_held.
  template <class Token>
  decltype(auto) async_proclaim(std::string value, Token&& token) {
    return State::executor_type::async_proclaim(*this, std::move(value), std::forward<Token>(token));
  }
  template <class Token>
  decltype(auto) async_resign(Token&& token) {
    return State::executor_type::async_resign(std::move(*this), std::forward<Token>(token));
  }

 private:
  friend struct detail::ElectionAccess;

  // The value lives behind a pointer an async_proclaim keeps: the
  // leadership may move while the announce is under way.
  BasicLeadership(guard_type guard, std::string value)
      : guard_(std::move(guard)), value_(guard_.owns_lock() ? std::make_shared<std::string>(std::move(value)) : nullptr) {}
  static const std::string& no_value() noexcept {
    static const std::string empty;
    return empty;
  }

  guard_type guard_;
  std::shared_ptr<std::string> value_;  // null for an empty leadership
};

}  // namespace pgmutex
