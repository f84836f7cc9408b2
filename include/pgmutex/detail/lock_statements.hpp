// The I/O unit of a mutex: every statement it sends, one at a time behind the
// I/O gate, and what those statements leave behind (acquires whose reply was
// lost, releases that failed, the holder last alerted on). It takes no lock
// but the gate, never touches the grant's book and runs no hook: its callers
// (MutexState) do that once the gate is left. Not part of the API.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pgmutex/backend.hpp"
#include "pgmutex/clock.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/detail/grant_book.hpp"
#include "pgmutex/detail/io_gate.hpp"
#include "pgmutex/detail/statement_outcomes.hpp"
#include "pgmutex/detail/token_seed.hpp"
#include "pgmutex/options.hpp"

namespace pgmutex::detail {

// What a plain Mutex's tries carry: nothing. A campaign's carry a
// GrantAnnouncement* instead (BackendElectsInOneStatement): the same code,
// instantiated apart, so a mutex's tries and releases stay what they were.
struct NoAnnouncement {};

template <Backend B, Clock C>
class LockStatements {
 public:
  using time_point = typename C::time_point;
  using duration = std::chrono::nanoseconds;
  using Attempt = AcquireAttempt<time_point>;

  // `options` and `clock` belong to the owning state, which outlives this.
  LockStatements(B b, const ValidOptions& options, const C& clock)
      : backend(std::move(b)),
        options_(options),
        clock_(clock),
        identity_(token_seed()),
        token_state_(identity_),
        plain_request_{lock_ref(), options_.instance_id, options_.stale_threshold, 0, options_.heartbeat_timeout},
        key_template_{lock_ref(), options_.instance_id, 0, 0, options_.heartbeat_timeout},
        release_key_(key_template_) {}
  LockStatements(const LockStatements&) = delete;
  LockStatements& operator=(const LockStatements&) = delete;

  // Every owner is gone and no grant is held (a guard releases before it
  // goes): a row that an acquire in doubt or a failed release may have left
  // is ours to remove.
  ~LockStatements() {
    if (IoLock io(gate_); io) clean_up_rows_in_doubt();
  }

  [[no_unique_address]] B backend;  // used under the gate only (or by its own thread-safe calls)

  // Some thread is inside a statement of this mutex (see IoGate::busy).
  bool busy() const noexcept { return gate_.busy(); }

  Result<void> create_schema() {
    IoLock io(gate_);
    if (!io) return reentered();
    return with_context(backend.create_schema(options_.table));
  }

  Result<std::optional<LockRow>> inspect() {
    IoLock io(gate_);
    if (!io) return reentered();
    return with_context(backend.inspect(lock_ref()));
  }

  // One statement that another part of the library makes on this lock (an
  // election's announce): `fn(backend)`, under the gate as every statement.
  template <class Fn>
  auto run(Fn&& fn) -> decltype(fn(backend)) {
    IoLock io(gate_);
    if (!io) return reentered();
    return with_context(fn(backend));
  }

  // run(fn) if no statement of this mutex is under way; nullopt at once if
  // one is (a campaign waiting in line holds the gate for its whole wait).
  template <class Fn>
  auto try_run(Fn&& fn) -> std::optional<decltype(fn(backend))> {
    IoLock io(gate_, TryEnter{});
    if (!io) return std::nullopt;
    return with_context(fn(backend));
  }

  // One acquire (two tries when the first reply is lost and nothing landed).
  // `held_here(now)` says whether this object holds the lock already: asked
  // under the gate, before any statement.
  // `queued`: a waiter's try, in its place in the queue (see
  // AcquireRequest::queue_ticket); null: a plain try. `announce`: a
  // campaign's (GrantAnnouncement*): a grant the try makes for itself is
  // announced in the same statement, and announce->announced says whether
  // it was (false after a grant adopted by its token: the reply was lost).
  template <class HeldHere, class Announce = NoAnnouncement>
  Attempt try_acquire(HeldHere&& held_here, QueuedWaiter* queued = nullptr, Announce announce = {}) {
    IoLock io(gate_);
    if (!io) return Attempt::failed(reentered().value());
    const time_point entered = clock_.now();
    if (auto fence = held_here(entered))
      return Attempt::failed(Error(Errc::already_acquired, context() + " is already held through this object (fence " +
                                                               std::to_string(*fence) +
                                                               "); release it before acquiring again"));
    for (int tries = 0; tries < 2; ++tries) {
      if (queued) [[unlikely]]
        return try_queued(*queued, tries == 0 ? entered : clock_.now(), announce);
      const GrantToken token = next_token();
      // When the statement went out, at the latest: the first try reuses the
      // reading taken once the gate was ours (an earlier send time only
      // shortens the lease the grant is given).
      const time_point sent = tries == 0 ? entered : clock_.now();
      plain_request_.token = token;
      auto outcome = send_try(plain_request_, announce);
      if (outcome) {
        if (outcome->acquired) [[likely]] {
          if (outcome->reclaimed) [[unlikely]]
            return Attempt::won(outcome->fence, token, sent, session_of_last(), std::move(outcome->holder));
          return Attempt::won(outcome->fence, token, sent, session_of_last());
        }
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

  // Takes a place at the back of the lock's queue, with a fresh token.
  Result<QueuedWaiter> enqueue()
    requires BackendQueuesWaiters<B>
  {
    IoLock io(gate_);
    if (!io) return reentered();
    const GrantToken token = next_token();
    plain_request_.token = token;
    auto place = backend.enqueue(plain_request_, options_.handoff_deadline);
    if (!place) return with_context<QueuedWaiter>(tl::unexpected(std::move(place.error())));
    return QueuedWaiter{*place, token};
  }

  // Leaves the queue (a timeout, a cancellation); an offer made to the place
  // meanwhile is passed on by the backend. A grant that a queued try whose
  // reply was lost may have confirmed is ours if the row carries our token:
  // released at once, so the line moves on (the waiter gave up), never
  // adopted later (its heartbeat may be long past by then). A release that
  // fails leaves it to the next contact, as a failed release does.
  Result<void> dequeue(const QueuedWaiter& queued)
    requires BackendQueuesWaiters<B>
  {
    IoLock io(gate_);
    if (!io) return reentered();
    auto left = backend.dequeue(queue_request(queued), queued.place.ticket);
    if (queued.outcome_unknown) {
      auto row = backend.inspect(lock_ref());
      const bool ours = row && *row && (*row)->token == queued.token;
      if (!row || (ours && !backend.release(HolderKey{lock_ref(), options_.instance_id, (*row)->fence, queued.token,
                                                        options_.heartbeat_timeout})))
        unreleased_.push_back(queued.token);
    }
    return with_context(std::move(left));
  }

  // Waits in the queue until woken (no statement), on a backend that blocks.
  Result<QueueWake> wait_in_queue(const QueuedWaiter& queued, const WatchRequest& w, duration limit, std::stop_token stop)
    requires BackendWaitsInQueue<B>
  {
    IoLock io(gate_);
    if (!io) return reentered();
    return with_context(backend.wait_in_queue(w, queued.place.ticket, limit, std::move(stop)));
  }

  // Whether a waiter should wake, on a backend that answers without blocking.
  std::optional<QueueWake> queue_wake(const QueuedWaiter& queued, const WatchRequest& w)
    requires BackendPollsQueue<B>
  {
    IoLock io(gate_);
    if (!io) return QueueWake::look;  // never reached: a waiter is not inside a statement
    return backend.queue_wake(w, queued.place.ticket);
  }

  // Deletes the row of a grant that ended, retrying transient failures. A
  // row that may still be there is deleted by its token at the next contact,
  // not left to go stale; it is never adopted again: a grant that was
  // released keeps its fence to itself, and the next gets a higher one.
  // `Vacate`: a leadership's resign (BackendElectsInOneStatement): the same
  // statement vacates the grant's term. A retry after an unknown outcome
  // that finds the row gone knows the first one landed, vacate included
  // (one transaction).
  template <bool Vacate = false>
  PGMUTEX_ALWAYS_INLINE Result<void> release(const typename GrantBook<time_point>::Grant& g) {
    IoLock io(gate_);
    if (!io) [[unlikely]]
      return reentered();
    // The key is written in place, under the gate: nothing else uses it then.
    HolderKey& key = release_key_;
    key.fence = g.fence;
    key.token = g.token;
    key.durable = g.durable;
    Result<void> deleted = send_release<Vacate>(key);
    for (int attempt = 1; !deleted && attempt < release_attempts; ++attempt) {
      if (deleted.error() != Errc::backend_unavailable && deleted.error() != Errc::outcome_unknown) break;
      deleted = send_release<Vacate>(key);
      if (!deleted && deleted.error() == Errc::lock_not_held) {
        // A retry after an unknown outcome finds the row gone: the first delete landed.
        deleted = {};
        break;
      }
    }
    if (!deleted && (deleted.error() == Errc::backend_unavailable || deleted.error() == Errc::outcome_unknown))
      unreleased_.push_back(key.token);
    return deleted;
  }

  // One heartbeat statement; `sent` is when it really went out.
  BeatAnswer<time_point> heartbeat(const HolderKey& key) {
    BeatAnswer<time_point> answer{{}, clock_.now(), {}};
    IoLock io(gate_);
    if (!io) [[unlikely]] {
      answer.result = reentered();
      return answer;
    }
    answer.sent = clock_.now();
    answer.result = backend.heartbeat(key);
    answer.session = session_of_last();
    return answer;
  }

  // Waits for a release, on a backend that is told of one on its own
  // connection: true if the wait ran (told of a release, or `limit` passed),
  // false if it failed; an error only if called from inside a statement.
  Result<bool> wait_for_release(duration limit)
    requires BackendWaitsForRelease<B>
  {
    IoLock io(gate_);
    if (!io) return reentered();
    return backend.wait_for_release(lock_ref(), limit).has_value();
  }

  PGMUTEX_ALWAYS_INLINE HolderKey key_of(const typename GrantBook<time_point>::Grant& g) const noexcept {
    HolderKey key = key_template_;  // copied, never changed: heartbeats build keys outside the gate
    key.fence = g.fence;
    key.token = g.token;
    key.durable = g.durable;
    return key;
  }
  LockRef lock_ref() const noexcept { return LockRef{options_.table, options_.lock_name, identity_}; }
  std::string context() const { return "lock '" + options_.lock_name + "'"; }

  // The lock named once: a text that names it already (a backend's
  // election refusal, the lease check run() makes) is left as it is, so the
  // user never reads "lock 'x': lock 'x': ..." (review finding 9).
  template <class T>
  Result<T> with_context(Result<T>&& r) const {
    if (!r && !r.error().detail.starts_with(context()))
      r.error().detail = context() + (r.error().detail.empty() ? "" : ": " + r.error().detail);
    return std::move(r);
  }

  tl::unexpected<Error> reentered() const {
    return fail(Errc::backend_error, context() + ": called from inside a statement of the same mutex on this thread "
                                                 "(a simulation runs tasks inside a hung statement)");
  }

  static duration age(double seconds) {
    return std::chrono::duration_cast<duration>(std::chrono::duration<double>(seconds));
  }

 private:
  static constexpr int release_attempts = 3;

  // One try's statement: a plain Mutex's, or a campaign's that announces a
  // grant it makes for itself (announce->announced set from the answer).
  PGMUTEX_ALWAYS_INLINE Result<AcquireResult> send_try(const AcquireRequest& request, NoAnnouncement) {
    return backend.try_acquire(request);
  }
  Result<AcquireResult> send_try(const AcquireRequest& request, GrantAnnouncement* announce)
    requires BackendElectsInOneStatement<B>
  {
    announce->announced = false;
    return backend.try_acquire(request, *announce);
  }

  template <bool Vacate>
  PGMUTEX_ALWAYS_INLINE Result<void> send_release(const HolderKey& key) {
    if constexpr (Vacate) return backend.release_vacating(key);
    else return backend.release(key);
  }

  AcquireRequest queue_request(const QueuedWaiter& queued) const noexcept {
    AcquireRequest r = plain_request_;  // under the gate, as every statement
    r.token = queued.token;
    r.queue_ticket = queued.place.ticket;
    return r;
  }

  // A queued try: it confirms an offer to our place, or takes an available
  // lock if no live waiter is ahead. A lost reply is resolved by trying
  // again (a confirm is idempotent), never by adopting the row by its
  // token: until the confirm lands, the queue may still pass an offer on
  // after its deadline, and adopting it then would make two holders.
  template <class Announce>
  Attempt try_queued(QueuedWaiter& queued, time_point sent, Announce announce) {
    for (int tries = 0; tries < 2; ++tries) {
      if (tries > 0) sent = clock_.now();
      auto outcome = send_try(queue_request(queued), announce);
      if (!outcome) {
        if (outcome.error() != Errc::outcome_unknown)
          return Attempt::failed(with_context<void>(tl::unexpected(std::move(outcome.error()))).error());
        queued.outcome_unknown = true;
        continue;
      }
      queued.outcome_unknown = false;
      if (outcome->acquired) {
        if (outcome->reclaimed) return Attempt::won(outcome->fence, queued.token, sent, session_of_last(), std::move(outcome->holder));
        Attempt won = Attempt::won(outcome->fence, queued.token, sent, session_of_last());
        won.provisional_for = outcome->provisional_for;  // a confirm that committed unflushed
        return won;
      }
      if (outcome->queue_place_lost) return Attempt::lost_place(std::move(outcome->holder), outcome->fence, outcome->holder_age_s);
      if (outcome->failover_grace_left_s > 0)
        return Attempt::taken(std::move(outcome->holder), 0, 0, false, outcome->failover_grace_left_s);
      return contended(std::move(outcome->holder), outcome->fence, outcome->holder_age_s);
    }
    return Attempt::failed(Error(Errc::outcome_unknown, context() + ": two queued tries in a row lost their replies"));
  }

  Attempt adopt(Fence fence, GrantToken token, time_point sent, double age_s) {
    std::erase(in_doubt_, token);
    return Attempt::won(fence, token, sent - age(age_s), session_of_last());
  }

  Attempt contended(std::string holder, Fence holder_fence, double age_s) {
    // Alert once per holder and fence.
    bool alert = false;
    if (age_s >= std::chrono::duration<double>(options_.alert_threshold).count() &&
        !(alerted_fence_ == holder_fence && alerted_holder_ == holder)) {
      alerted_holder_ = holder;
      alerted_fence_ = holder_fence;
      alert = true;
    }
    return Attempt::taken(std::move(holder), holder_fence, age_s, alert);
  }

  // The server session and history of the last statement.
  PGMUTEX_ALWAYS_INLINE ServerSession session_of_last() const noexcept {
    ServerSession at;
    if constexpr (BackendReportsSession<B>) at.session = backend.session();
    if constexpr (BackendReportsHistory<B>) at.history = backend.history();
    if constexpr (BackendReportsDurability<B>) at.durability = backend.last_heartbeat_durability();
    return at;
  }

  bool is_unreleased(GrantToken token) const noexcept {
    return token != 0 && !unreleased_.empty() && std::ranges::find(unreleased_, token) != unreleased_.end();
  }

  bool is_in_doubt(GrantToken token) const noexcept {
    return token != 0 && !in_doubt_.empty() && std::ranges::find(in_doubt_, token) != in_doubt_.end();
  }

  // Deletes our row of a grant whose release failed. True if it is gone now.
  bool delete_ours(Fence fence, GrantToken token) {
    auto deleted = backend.release(HolderKey{lock_ref(), options_.instance_id, fence, token, options_.heartbeat_timeout});
    if (!deleted && deleted.error() != Errc::lock_not_held) return false;
    std::erase(unreleased_, token);
    return true;
  }

  // Rows that acquires in doubt created after all, or failed releases left,
  // found by their tokens and removed.
  void clean_up_rows_in_doubt() noexcept {
    if (in_doubt_.empty() && unreleased_.empty()) return;
    auto row = backend.inspect(lock_ref());
    if (row && *row && (is_in_doubt((*row)->token) || is_unreleased((*row)->token)))
      (void)backend.release(HolderKey{lock_ref(), options_.instance_id, (*row)->fence, (*row)->token,
                                      options_.heartbeat_timeout});
    if (row) {
      in_doubt_.clear();
      unreleased_.clear();
    }
  }

  // A fresh token for each attempt: never 0 (0 is "no token"). The start is
  // random (token_seed: the OS's entropy, mixed, distinct per mutex) and each
  // attempt steps it by an odd constant, so this mutex never repeats one in
  // 2^64 attempts; another mutex's tokens meet ours only if the two random
  // starts lie within that many steps of each other, which is no likelier
  // than two random tokens being equal. Mixing each step as well (splitmix64's
  // output function) cost 19 of an in-memory cycle's ~680 instructions.
  GrantToken next_token() noexcept {
    for (;;) {
      const std::uint64_t z = (token_state_ += 0x9E3779B97F4A7C15ULL);
      if (z != 0) [[likely]]
        return z;
    }
  }

  const ValidOptions& options_;
  const C& clock_;
  // Serializes statements: a backend connection never serves two threads.
  // Held across I/O, so the book, the wake-ups and the guard never take it.
  // Everything below is guarded by it.
  IoGate gate_;
  std::vector<GrantToken> in_doubt_;    // tokens of acquires whose outcome is unknown
  std::vector<GrantToken> unreleased_;  // tokens of grants whose release failed
  // This mutex's LockRef::identity: its first token seed, distinct from
  // every other one in the process (token_seed), and fixed like the options.
  const std::uint64_t identity_;
  std::uint64_t token_state_;
  // A plain try's request (and an enqueue's): the same for every try of
  // this mutex but its token, set under the gate before each, so it is not
  // built again on every call; a queued try's is a copy with its place.
  AcquireRequest plain_request_;
  const HolderKey key_template_;  // a grant's key, less its fence, token and durability
  HolderKey release_key_;  // the release's key, written under the gate (key_template_ plus the grant)
  std::string alerted_holder_;
  Fence alerted_fence_ = -1;
};

}  // namespace pgmutex::detail
