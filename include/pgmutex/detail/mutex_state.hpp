// The shared state of one BasicMutex: the thin coordinator of its three units
// (DESIGN.md, "the execution model"):
//   GrantBook        the grant's bookkeeping, behind a short lock; every read
//                    compares the clock with the lease deadline
//   WakeupSchedule   the lease timer: timer tasks that do no I/O, declare the
//                    lease lost at its deadline and post the heartbeats
//   LockStatements   the I/O, one statement at a time behind the I/O gate
// It moves what a statement answered into the book, arms the wake-ups, and
// runs stop callbacks and metrics hooks with no internal lock held. It lives
// at a stable address, shared by the mutex, its guards, singleton wrappers
// and the executor's tasks (TaskScope). Not part of the API.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>

#include "pgmutex/backend.hpp"
#include "pgmutex/clock.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/executor.hpp"
#include "pgmutex/detail/acquire_wait.hpp"
#include "pgmutex/detail/grant_book.hpp"
#include "pgmutex/detail/light_mutex.hpp"
#include "pgmutex/detail/lock_statements.hpp"
#include "pgmutex/detail/task_scope.hpp"
#include "pgmutex/detail/wakeup_schedule.hpp"
#include "pgmutex/guard.hpp"
#include "pgmutex/metrics.hpp"
#include "pgmutex/options.hpp"

namespace pgmutex::detail {

// What the backend tells the option rules (its commit mode).
template <Backend B>
BackendTraits traits_of(const B& backend) noexcept {
  if constexpr (BackendReportsCommitMode<B>) return BackendTraits{backend.heartbeat_commits_asynchronously()};
  else return BackendTraits{};
}

template <Backend B, Clock C, Metrics M, Executor E>
class MutexState {
 public:
  using time_point = typename C::time_point;
  using duration = std::chrono::nanoseconds;
  using Book = GrantBook<time_point>;
  using executor_type = E;
  using guard_type = BasicGuard<MutexState>;

  MutexState(ValidOptions o, B b, C c, M m, E e)
      : options(std::move(o)), clock(std::move(c)), metrics(std::move(m)), executor(std::move(e)),
        book(options.lease(), traits_of(b).heartbeat_commits_asynchronously), io(std::move(b), options, clock) {}

  MutexState(const MutexState&) = delete;
  MutexState& operator=(const MutexState&) = delete;

  ValidOptions options;
  [[no_unique_address]] C clock;
  [[no_unique_address]] M metrics;
  [[no_unique_address]] E executor;
  Book book;
  LockStatements<B, C> io;  // io.backend: the lock table

  // ---- lifetime ---------------------------------------------------------
  // Owners (the mutex, a live guard, singleton wrappers) keep it open; when
  // the last one goes, wake-ups are cancelled. References (the owners as
  // one, plus each posted task) keep it allocated.

  PGMUTEX_ALWAYS_INLINE void add_owner() noexcept { owners_.add(); }
  PGMUTEX_ALWAYS_INLINE static void drop_owner(MutexState* s) noexcept {
    if (!s->owners_.drop()) [[likely]]
      return;
    s->close();
    drop_reference(s);
  }

  // ---- operations ------------------------------------------------------

  Result<void> create_schema() { return io.create_schema(); }
  Result<std::optional<LockRow>> inspect() { return io.inspect(); }

  // The statements under the I/O gate, then (the gate left) the book and the hooks.
  // `announce`: a campaign's (see LockStatements::try_acquire).
  template <class Announce = NoAnnouncement>
  PGMUTEX_ALWAYS_INLINE Result<guard_type> try_acquire(Announce announce = {}) {
    announce_if_expired();  // a grant held past its deadline is over: said so before a new one begins
    return finish(io.try_acquire([this](time_point now) { return held_fence(now); }, nullptr, announce));
  }

  // A queued waiter's try (detail/acquire_wait.hpp); `place_lost`: refused
  // because its place in the queue is gone.
  template <class Announce = NoAnnouncement>
  Result<guard_type> try_acquire_queued(QueuedWaiter& queued, bool& place_lost, Announce announce = {}) {
    announce_if_expired();
    auto attempt = io.try_acquire([this](time_point now) { return held_fence(now); }, &queued, announce);
    place_lost = attempt.place_lost;
    return finish(std::move(attempt));
  }

  // The fence this object holds the lock with now (0: a grant whose
  // details are gone), if it does: a try then refuses to acquire again.
  PGMUTEX_ALWAYS_INLINE std::optional<Fence> held_fence(time_point now) const noexcept {
    if (!book.holds(now)) [[likely]]
      return std::nullopt;
    const auto g = book.current(now);
    return g ? g->fence : 0;
  }

  // Tries until granted, timed out or stopped (detail/acquire_wait.hpp).
  Result<guard_type> acquire(std::optional<duration> timeout, std::stop_token stop) {
    return AcquireWait::run(*this, timeout, std::move(stop));
  }

  // A campaign (pgmutex/election.hpp): acquire(), each try carrying the
  // value, so that the grant and its announcement are one statement
  // (BackendElectsInOneStatement); `announcement.announced` says whether the
  // grant returned was announced.
  Result<guard_type> campaign(std::optional<duration> timeout, std::stop_token stop, GrantAnnouncement& announcement)
    requires BackendElectsInOneStatement<B>
  {
    return AcquireWait::run(*this, timeout, std::move(stop), &announcement);
  }

  Result<void> release_current() {
    const auto current = book.held_generation();
    if (!current) return fail(Errc::lock_not_held, io.context() + " is not held through this object");
    return release_grant(*current);
  }

  Result<void> heartbeat_current() {
    const auto current = book.held_generation();
    if (!current) return fail(Errc::lock_not_held, io.context() + " is not held through this object");
    return heartbeat_grant(*current);
  }

  // Some thread is inside a statement of this mutex (see IoGate::busy).
  bool io_busy() const noexcept { return io.busy(); }

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

  // `Vacate`: a leadership's resign, whose release statement also vacates
  // the grant's term (BackendElectsInOneStatement); a lost lease's grant is
  // released (and vacated) by its key all the same.
  template <bool Vacate = false>
  PGMUTEX_ALWAYS_INLINE Result<void> release_grant(std::uint64_t which) {
    announce_if_expired();
    auto ended = book.end(which);
    if (!ended) {
      book.forget(which);  // its guard is going: no one will ask how it ended
      return fail(Errc::lock_not_held, io.context() + " grant already ended");
    }
    // A pending wake-up stays: it finds nothing held and ends, and keeps
    // acquire/release cycles free of executor work.
    Result<void> deleted = io.template release<Vacate>(ended->grant);
    if (deleted) [[likely]] {
      call_released(metrics, options.lock_name, options.instance_id);
      return {};
    }
    if (ended->was_lost && deleted.error() == Errc::lock_not_held)
      return fail(Errc::lock_not_held, io.context() + " was lost before release: " + book.lost_reason().message());
    return io.with_context(std::move(deleted));
  }

  // The guard's reference: an owner, like the mutex.
  friend guard_type;

 private:
  static constexpr std::chrono::milliseconds retry_base{100};

  ~MutexState() = default;  // every owner is gone: io removes rows an acquire in doubt may have left

  PGMUTEX_ALWAYS_INLINE void add_reference() noexcept { references_.add(); }
  PGMUTEX_ALWAYS_INLINE static void drop_reference(MutexState* s) noexcept {
    if (s->references_.drop()) delete s;
  }

  // The last owner went: no wake-up and no posted task may run from now on.
  // Cancelling a wake-up waits for one that is running; it may have posted a
  // task, which holds its own reference. Posted tasks that have not started
  // find the scope shut and do nothing; running ones are waited for, unless
  // this is one of them, so that no hook or statement of this mutex runs
  // after its last owner went.
  void close() noexcept {
    tasks_.shut();
    wakeups_.close(executor);
    tasks_.wait_for_running();
  }

  static duration since_epoch(time_point t) noexcept {
    return std::chrono::duration_cast<duration>(t.time_since_epoch());
  }

  // ---- acquiring: the hooks after the statements -------------------------

  // Outside every lock: the grant is entered in the book, the wake-up is
  // armed, and the hooks run.
  PGMUTEX_ALWAYS_INLINE Result<guard_type> finish(typename LockStatements<B, C>::Attempt a) {
    using Kind = typename LockStatements<B, C>::Attempt::Kind;
    if (a.kind == Kind::failed) [[unlikely]]
      return tl::unexpected(std::move(*a.error));
    if (a.kind == Kind::taken) {
      call_contended(metrics, options.lock_name, options.instance_id);
      if (a.alert) call_alert(metrics, options.lock_name, a.who, a.age_s);
      return guard_type(Errc::lock_held, HolderInfo{std::move(a.who), a.fence, a.age_s, a.grace_left_s});
    }
    const time_point now = clock.now();
    // A provisional grant (a confirm that skipped its flush) ends where the
    // server would pass the offer on, less the share the lease leaves of the
    // stale threshold: the same margin against a clock slower than the
    // server's as every lease keeps.
    duration provisional = a.provisional_for;
    if (provisional > duration::zero()) [[unlikely]]
      provisional = std::max(duration(1), std::chrono::duration_cast<duration>(
                                              provisional * (std::chrono::duration<double>(options.lease()).count() /
                                                             std::chrono::duration<double>(options.stale_threshold).count())));
    const std::uint64_t generation =
        book.begin(a.fence, a.token, a.sent, now + options.heartbeat_interval, a.session, provisional);
    // A provisional grant's first heartbeat is due at once (GrantBook::begin).
    if (provisional > duration::zero()) [[unlikely]]
      arm_wakeup(now, now);
    else
      arm_wakeup(std::min(now + options.heartbeat_interval, a.sent + options.lease()), now);
    if (!a.who.empty()) call_stale_reclaimed(metrics, options.lock_name, options.instance_id, a.who);
    call_acquired(metrics, options.lock_name, options.instance_id, a.fence);
    const time_point lease_end = provisional > duration::zero() ? std::min(a.sent + options.lease(), a.sent + provisional)
                                                                : a.sent + options.lease();
    call_lease_renewed(metrics, options.lock_name, options.instance_id, since_epoch(lease_end));
    call_acquire_latency(metrics, options.lock_name, options.instance_id,
                         std::chrono::duration<double>(now - a.sent).count());
    add_owner();
    return guard_type(this, generation, a.fence);
  }

  // ---- the heartbeat ----------------------------------------------------

  Result<void> heartbeat_grant_referenced(std::uint64_t which) {
    announce_if_expired();
    const auto grant = book.beat_grant(which, clock.now());
    if (!grant) return fail(Errc::lock_not_held, io.context() + ": " + grant.error().detail);
    Result<void> answer = beat(*grant, /*automatic=*/false);
    if (!answer && answer.error() != Errc::lock_not_held) return answer;
    if (!answer) return fail(Errc::lock_not_held, io.context() + ": " + book.lost_reason().message());
    return {};
  }

  // One heartbeat of grant `g`, on this thread; what its answer means goes
  // into the book, and loss is announced once no lock is held.
  Result<void> beat(const typename Book::Grant& g, bool automatic) {
    auto answer = io.heartbeat(io.key_of(g));
    return note_beat(g, answer.sent, std::move(answer.result), answer.session, automatic, /*announce_here=*/true);
  }

  // What the answer to a heartbeat means, into the book; the next wake-up
  // armed; the hooks run. A lost lease is announced here, or posted when
  // this runs on a backend's thread that must not wait for a stop callback.
  Result<void> note_beat(const typename Book::Grant& g, time_point sent, Result<void> answer, ServerSession session,
                         bool automatic, bool announce_here) {
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
    // A statement, so off this thread (a backend's, perhaps). Not posted
    // (no memory): still due, the next good heartbeat posts it again.
    if (applied.reannounce) (void)post([this, which = g.generation] { reannounce(which); });
    return io.with_context(std::move(answer));
  }

  // An election's value, announced again after a failover (see
  // GrantBook::note_announced): the leadership's own announce, sent by the
  // state because only the heartbeat sees the server history change. Under
  // the gate, so it goes out after (or before) a proclaim, never with a
  // value the proclaim replaced; and only while the lease holds, so a leader
  // never announces past its lease.
  void reannounce(std::uint64_t which) {
    if constexpr (BackendKeepsElections<B>) {
      (void)io.run([&](auto& backend) -> Result<void> {
        auto again = book.reannouncement(which, clock.now());
        if (!again) return {};
        auto answer = backend.announce(io.key_of(again->grant), again->value);
        if (answer || answer.error() == Errc::lock_not_held) book.reannounce_settled(which);
        if (!answer) return tl::unexpected(std::move(answer.error()));
        return {};
      });
    }
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
        taken = io.backend.heartbeat_async(io.key_of(g), [this, g, sent](BeatReply reply) {
          tasks_.run([&] {
            (void)note_beat(g, sent, std::move(reply.result), ServerSession{reply.session, reply.history, reply.durability},
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

  // ---- lost leases --------------------------------------------------------

  // Stops the grant's token (running its stop callbacks) and runs the lost
  // hook: user code, so never under a lock of ours.
  void announce_lost(LostNotice notice) {
    if (notice.stop) notice.stop->request_stop();
    call_lost(metrics, options.lock_name, options.instance_id, notice.reason);
  }

  // A lease whose deadline passed before the timer said so (a paused
  // process, a late timer thread) is declared lost now, and announced off
  // this thread, before anything acts on the grant.
  PGMUTEX_ALWAYS_INLINE void announce_if_expired() {
    if (auto notice = book.expire(clock.now())) post_lost(std::move(*notice), /*may_announce_here=*/true);
  }

  // Runs `fn` on the executor's I/O side, keeping this state alive
  // meanwhile. False if it will not run (no thread or memory for it).
  template <class F>
  bool post(F fn) {
    add_reference();
    try {
      executor.post([this, fn = std::move(fn)]() mutable {
        tasks_.run(fn);
        drop_reference(this);
      });
      return true;
    } catch (...) {
      drop_reference(this);
      return false;
    }
  }

  // Announces a lost lease off this thread (a stop callback may block). A
  // post is all or nothing: if it throws (no memory), the task will never
  // run, so the notice is announced here when this thread may wait for a
  // stop callback (the timer's, or the caller's), else kept for the next
  // wake-up: late rather than never.
  void post_lost(LostNotice notice, bool may_announce_here) {
    add_reference();
    try {
      executor.post([this, notice]() mutable {  // a copy: ours stays whole if the post throws
        tasks_.run([&] { announce_lost(std::move(notice)); });
        drop_reference(this);
      });
      return;
    } catch (...) {
      drop_reference(this);
    }
    if (may_announce_here) return announce_lost(std::move(notice));
    wakeups_.keep_unannounced(std::move(notice));
    try {
      arm_wakeup(clock.now() + retry_base);
    } catch (...) {  // no memory for a timer: the next wake-up announces it
    }
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
  void arm_wakeup(time_point due) { arm_wakeup(due, clock.now()); }
  void arm_wakeup(time_point due, time_point now) {
    wakeups_.arm(executor, due, now, [this](std::uint64_t id) { return [this, id] { on_wakeup(id); }; });
  }

  void on_wakeup(std::uint64_t id) {
    if (!wakeups_.starting(id)) return;
    auto due = book.on_timer(clock.now());
    if (due.next_wakeup) arm_wakeup(*due.next_wakeup);
    if (due.beat) {
      if constexpr (BackendBeatsAsynchronously<B>) start_async_beat(*due.beat);
      else if (!post([this, g = *due.beat] { (void)beat(g, /*automatic=*/true); })) beat_not_started();
    }
    // Off the timer: a stop callback may block, and other locks' deadlines must not wait for it.
    if (due.lost) post_lost(std::move(*due.lost), /*may_announce_here=*/true);
    if (auto late = wakeups_.take_unannounced()) post_lost(std::move(*late), /*may_announce_here=*/true);
    wakeups_.finished(id);
  }

  WakeupSchedule<time_point> wakeups_;
  TaskScope tasks_;
  LightRefCount owners_{1};
  LightRefCount references_{1};
};

}  // namespace pgmutex::detail
