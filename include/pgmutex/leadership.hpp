// What a campaign returns (pgmutex/election.hpp): the leadership of one
// term. It is a guard with a value: the term is the grant's fence, the
// watchdog and "lost before anyone else can lead" hold as for any guard, and
// the value is what this leader announced. Resigning (or the destructor)
// vacates the term and releases the lock to the next in line, in one
// statement, so observers hear the vacancy before the successor's election.
// Used from one thread at a time, as a guard is.
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

struct ElectionAccess;  // below


// The holder of grant `which` announces `value` (proclaimed, or elected when
// the campaign's acquire could not announce with its grant): one statement,
// under the mutex's I/O gate, keyed by the grant as its heartbeat is. It is
// refused without a statement once the lease is over on this process's
// clock, checked again once the gate is ours (a hung statement before it may
// have outlasted the lease), and the server refuses one whose row went
// stale: a leader never announces past its lease. The book notes what
// landed, under the gate: after a failover the state announces it again
// (GrantBook::note_announced).
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

// Makes a leadership from a campaign's guard (its constructor is private),
// and ends one (a guard's release whose statement vacates the term).
struct ElectionAccess {
  template <class Leadership, class Guard>
  static Leadership elected(Guard guard, std::string value) {
    return Leadership(std::move(guard), std::move(value));
  }
  template <class Leadership, class Guard>
  static Leadership not_elected(Guard guard) {
    return Leadership(std::move(guard), std::string());
  }
  // One statement (BackendElectsInOneStatement::release_vacating): the term
  // vacated and the lock released to the next in line, atomically. Keyed by
  // the grant, so it goes out whether or not the lease was lost on this
  // process's clock: a row still ours is vacated and handed on all the same.
  template <class Guard>
  static Result<void> release_vacating(Guard& guard) {
    return guard.template release_vacating<true>();
  }
  // A campaign's end, blocking or async, once its acquire returned: an
  // empty guard is an empty leadership. A grant whose statement announced
  // `value` (`announced`: the usual case, one statement in all) leads at
  // once; the book notes the value, to announce it again after a failover
  // that lost it. A grant not shown announced (the reply of the try that
  // granted it was lost and the grant adopted by its token, or the server
  // records a term at or above its fence) announces now, one statement more
  // (idempotent); if that fails, nobody leads on the grant: the release
  // vacates whatever landed and hands the lock to the next in line. Only
  // that case makes a statement: the async campaign runs it where its
  // statements run.
  template <class Leadership, class Guard>
  static Result<Leadership> take_office(Guard guard, std::string value, bool announced) {
    if (!guard) return not_elected<Leadership>(std::move(guard));
    auto* state = AsyncAccess::guard_state(guard);
    if (announced) {
      state->book.note_announced(AsyncAccess::generation(guard), value);
    } else if (auto now_announced = announce_grant(*state, AsyncAccess::generation(guard), value); !now_announced) {
      (void)release_vacating(guard);
      return tl::unexpected(std::move(now_announced.error()));
    }
    return elected<Leadership>(std::move(guard), std::move(value));
  }
  // Where a leadership's value lives (null for an empty one): an async
  // proclaim writes the new value there when its handler runs.
  template <class Leadership>
  static std::shared_ptr<std::string> value_slot(const Leadership& leadership) noexcept {
    return leadership.value_;
  }
  template <class Election>
  static auto& mutex_of(Election& election) noexcept {
    return election.mutex_;
  }
  // An observer's state (its loop) and its next change, waiting out an
  // unreachable server: what its async forms run.
  template <class Observer>
  static auto* observer_state(Observer& observer) noexcept {
    return AsyncAccess::state_of(observer.mutex_);
  }
  template <class Observer>
  static Result<std::optional<LeaderChange>> next_waiting_out(Observer& observer, const std::stop_token& stop) {
    return observer.next_waiting_out(stop);
  }
};

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

  // Vacates the term (observers are told nobody leads) and releases the
  // lock to the next in line, in one statement: the successor is woken by
  // the same commit that vacates. Errc::lock_not_held if the term was over
  // already (the lease lost and the row taken over): nothing is left to
  // give up then.
  Result<void> resign(nothrow_t) {
    if (!guard_.owns_lock()) return fail(Errc::lock_not_held, "leadership holds no term");
    return detail::ElectionAccess::release_vacating(guard_);
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
