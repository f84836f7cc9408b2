// What a mutex's statements come to, as LockStatements hands them to the
// coordinator (MutexState): an acquire try's outcome, a heartbeat's answer,
// a waiter's place in the queue. Not part of the API.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "pgmutex/backend.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/detail/grant_records.hpp"

namespace pgmutex::detail {

// What one acquire try came to, and the hooks it owes, fired once the gate is
// left. Built only by the named makers, each setting what its outcome needs:
// a try is on every poll's path, and zeroing a large record per try shows in
// the cycle's cost.
template <class TimePoint>
struct AcquireAttempt {
  enum class Kind : unsigned char { won, taken, failed };
  Kind kind;
  bool alert;
  bool place_lost = false;  // taken: a queued try found its place in the queue gone (enqueue again)
  Fence fence;
  GrantToken token;
  TimePoint sent;
  double age_s;
  double grace_left_s;     // taken: > 0 if refused by a failover grace (who: "(failover grace)")
  ServerSession session;   // won: the server session that granted it
  std::chrono::nanoseconds provisional_for{0};  // won: not yet durable (AcquireResult::provisional_for)
  std::string who;             // won by reclaim: the previous holder; taken: the holder
  std::optional<Error> error;  // failed: why

  static AcquireAttempt won(Fence f, GrantToken t, TimePoint at, ServerSession s) {
    return AcquireAttempt(Kind::won, false, f, t, at, 0, 0, s);
  }
  static AcquireAttempt won(Fence f, GrantToken t, TimePoint at, ServerSession s, std::string previous) {
    return AcquireAttempt(Kind::won, false, f, t, at, 0, 0, s, std::move(previous), std::nullopt);
  }
  static AcquireAttempt taken(std::string holder, Fence f, double age, bool alert, double grace_left = 0) {
    return AcquireAttempt(Kind::taken, alert, f, 0, {}, age, grace_left, {}, std::move(holder), std::nullopt);
  }
  static AcquireAttempt lost_place(std::string holder, Fence f, double age) {
    AcquireAttempt a(Kind::taken, false, f, 0, {}, age, 0, {}, std::move(holder), std::nullopt);
    a.place_lost = true;
    return a;
  }
  static AcquireAttempt failed(Error e) {
    return AcquireAttempt(Kind::failed, false, 0, 0, {}, 0, 0, {}, {}, std::move(e));
  }

 private:
  // A constructor, not aggregate initialization: GCC clears a whole
  // aggregate (padding included) with `rep stos` before filling it in.
  AcquireAttempt(Kind k, bool a, Fence f, GrantToken t, TimePoint at, double age, double grace, ServerSession s,
                 std::string w, std::optional<Error> e)
      : kind(k), alert(a), fence(f), token(t), sent(at), age_s(age), grace_left_s(grace), session(s), who(std::move(w)),
        error(std::move(e)) {}
  // A grant nobody held (the common outcome): no string or error to move in;
  // each std::string move is a call and a copy (callgrind: ~100 instructions
  // of a ~1,000-instruction in-memory cycle).
  AcquireAttempt(Kind k, bool a, Fence f, GrantToken t, TimePoint at, double age, double grace, ServerSession s)
      : kind(k), alert(a), fence(f), token(t), sent(at), age_s(age), grace_left_s(grace), session(s) {}
};

// A heartbeat's answer, with when it really went out (after any wait for the
// gate) and the server session that answered.
template <class TimePoint>
struct BeatAnswer {
  Result<void> result;
  TimePoint sent;
  ServerSession session;
};

// A waiter's place in the lock's queue, and the token its grant will carry.
struct QueuedWaiter {
  QueuePlace place;
  GrantToken token = 0;
  // A queued try's reply was lost: the grant it confirmed may be ours, and
  // is resolved by trying again while queued, or by the token once out.
  bool outcome_unknown = false;
};

}  // namespace pgmutex::detail
