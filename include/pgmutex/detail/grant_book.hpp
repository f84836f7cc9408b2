// The bookkeeping of one mutex's grant: pure state behind a short lock that
// is never held across a call out (no I/O, no user code, no executor call
// that may wait). Everything that must answer while a statement hangs (the
// guard's accessors, the lease deadline) reads it here. Not part of the API.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>

#include "pgmutex/backend.hpp"
#include "pgmutex/detail/grant_records.hpp"
#include "pgmutex/detail/light_mutex.hpp"
#include "pgmutex/detail/unconfirmed_beats.hpp"
#include "pgmutex/error.hpp"

namespace pgmutex::detail {

template <class TimePoint>
class GrantBook {
 public:
  using time_point = TimePoint;
  using duration = std::chrono::nanoseconds;

  // The grant a statement is about: the key's parts and the generation that
  // tells whether the grant is still the current one when the answer comes.
  struct Grant {
    Fence fence = 0;
    GrantToken token = 0;
    std::uint64_t generation = 0;
    bool durable = false;  // a heartbeat of it must commit synchronously (see durable_due)
  };

  // `asynchronous`: an acknowledged heartbeat may still be lost (the
  // backend commits heartbeats asynchronously). The lease then counts from
  // the last good send the server is known to have made durable: one it
  // committed synchronously (HeartbeatDurability::durable), or one whose
  // commit the server's WAL flush position has since passed, as a later
  // answer of the same server session shows (wal_before of a heartbeat sent
  // after its answer came lies past its commit; a later wal_flushed at or
  // past that proves it flushed). Never because time passed: a server with
  // a slow WAL writer (wal_writer_delay) may hold an acknowledged commit in
  // memory for as long as it likes, and a crash forgets it. A new server
  // session starts the proof afresh (a restart may have lost the unflushed).
  GrantBook(duration lease, bool asynchronous) noexcept : lease_(lease), asynchronous_(asynchronous) {}

  [[nodiscard]] duration lease() const noexcept { return lease_; }

  // ---- read by the guard and the mutex: never waits for I/O ------------
  // Each read compares `now` (the monotonic clock, read by the caller at
  // the moment of the read) with the lease deadline: a process paused past
  // its deadline answers "lost" at its first read after it resumes, whether
  // or not the lease timer has run yet.

  [[nodiscard]] PGMUTEX_ALWAYS_INLINE bool holds(time_point now) const noexcept {
    // Nothing held (or lost): due_ says so without the lock. Every try asks.
    if (due_.load(std::memory_order_acquire) == std::numeric_limits<typename time_point::rep>::max()) [[likely]]
      return false;
    LightLock lock(mutex_);
    return held_ && !lost_ && !past_deadline(now);
  }

  // Grant `generation` is the current one, held, and not lost.
  [[nodiscard]] bool holds(std::uint64_t generation, time_point now) const noexcept {
    LightLock lock(mutex_);
    return generation == generation_ && held_ && !lost_ && !past_deadline(now);
  }

  // An older grant whose guard is still alive was lost if it is among those
  // that ended lost (released through the mutex, or superseded by a new grant).
  [[nodiscard]] bool lost(std::uint64_t generation, time_point now) const noexcept {
    LightLock lock(mutex_);
    if (generation == generation_) return held_ && (lost_ || past_deadline(now));
    return std::find(ended_lost_.begin(), ended_lost_.end(), generation) != ended_lost_.end();
  }

  // Declares the lease lost if its deadline has passed at `now` and nothing
  // declared it yet (the timer is late: a paused process, a busy timer
  // thread). The caller announces the notice, outside every lock. Called
  // before anything that acts on the grant, so that no action of a grant
  // past its deadline goes out as if it were held.
  // Twice per acquire/release cycle: `now` before the deadline (or nothing
  // held) answers from due_ without the lock or a call; anything else is
  // decided under the lock, as every other read.
  [[nodiscard]] PGMUTEX_ALWAYS_INLINE std::optional<LostNotice> expire(time_point now) {
    if (now.time_since_epoch().count() < due_.load(std::memory_order_acquire)) [[likely]]
      return std::nullopt;
    return expire_locked(now);
  }

  // The guard of grant `generation` is gone: no need to remember how it ended.
  void forget(std::uint64_t generation) {
    LightLock lock(mutex_);
    std::erase(ended_lost_, generation);
  }

  [[nodiscard]] std::stop_token stop_token(std::uint64_t generation) {
    LightLock lock(mutex_);
    if (generation != generation_ || !held_) {
      std::stop_source ended;  // the grant is over: a token that is already stopped
      ended.request_stop();
      return ended.get_token();
    }
    // Made on first request, so a grant nobody watches costs no allocation.
    // No callback can be registered on a new source yet: stopping it here runs none.
    if (!stop_source_) {
      stop_source_.emplace();
      if (lost_) stop_source_->request_stop();
    }
    if (lost_ && !stop_source_->stop_requested()) {
      // Declared lost, and the announcement that stops this source (and
      // runs its callbacks, off this thread) is on its way: the token the
      // caller gets now already says so.
      std::stop_source ended;
      ended.request_stop();
      return ended.get_token();
    }
    return stop_source_->get_token();
  }

  [[nodiscard]] std::optional<Grant> current(time_point now) const noexcept {
    LightLock lock(mutex_);
    if (!held_ || lost_ || past_deadline(now)) return std::nullopt;
    return Grant{fence_, token_, generation_};
  }

  // Grant `generation` while this object still owns it, lost or not (a
  // resign vacates a term whose lease was lost: its row may still be there).
  [[nodiscard]] std::optional<Grant> owned(std::uint64_t generation) const noexcept {
    LightLock lock(mutex_);
    if (!held_ || generation != generation_) return std::nullopt;
    return Grant{fence_, token_, generation_};
  }

  // The generation of the grant held (lost or not), if any.
  [[nodiscard]] std::optional<std::uint64_t> held_generation() const noexcept {
    LightLock lock(mutex_);
    if (!held_) return std::nullopt;
    return generation_;
  }

  [[nodiscard]] Error lost_reason() const {
    LightLock lock(mutex_);
    return lost_reason_;
  }

  // ---- changed by the mutex ----------------------------------------------

  // A new grant whose lease counts from `sent` (when the server stamped the
  // row, on our clock, never later). Returns its generation. `provisional`
  // (above zero): the grant is not durable yet (AcquireResult::provisional_for),
  // so its lease ends at `sent + provisional` at the latest, its first
  // heartbeat is due at once and commits synchronously, and only such a
  // heartbeat answered in the same server session (`at`) lifts that end.
  // begin() and end() run once per acquire/release cycle each, from one
  // caller: inlined there, they cost no call and no spill.
  PGMUTEX_ALWAYS_INLINE std::uint64_t begin(Fence fence, GrantToken token, time_point sent, time_point next_beat,
                                            ServerSession at, duration provisional = duration::zero()) {
    LightLock lock(mutex_);
    if (held_ && (lost_ || past_deadline(sent))) ended_lost_.push_back(generation_);  // its guard still answers lost()
    last_good_session_ = at.session;
    last_good_history_ = at.history;
    unconfirmed_.clear();
    forget_announced();
    held_ = true;
    lost_ = false;
    fence_ = fence;
    token_ = token;
    ++generation_;
    failures_ = 0;
    beat_in_flight_ = false;
    if (stop_source_) stop_source_.reset();
    last_good_send_ = trusted_send_ = sent;  // an acquire commits synchronously (but see `provisional`)
    next_beat_at_ = std::min(next_beat, sent + lease_);
    provisional_until_ = time_point::max();
    if (provisional > duration::zero()) [[unlikely]] {
      provisional_until_ = sent + std::min(provisional, lease_);
      provisional_session_ = at.session;
      provisional_since_ = sent;
      next_beat_at_ = sent;
    }
    note_deadline();
    return generation_;
  }

  // Ends the grant `generation` (released by its guard). Returns what the
  // release statement needs and whether the lease had been lost (the reason
  // stays readable through lost_reason()), or nothing if that grant already ended.
  struct Ended {
    Grant grant;
    bool was_lost = false;
  };
  PGMUTEX_ALWAYS_INLINE std::optional<Ended> end(std::uint64_t generation) {
    LightLock lock(mutex_);
    if (!held_ || generation != generation_) return std::nullopt;
    Ended ended{Grant{fence_, token_, generation_}, lost_};
    if (lost_) ended_lost_.push_back(generation_);  // a guard may still ask (a release through the mutex)
    held_ = false;
    lost_ = false;
    forget_announced();
    ++generation_;  // the guard's grant is over: its lost()/stop_token() no longer apply
    if (stop_source_) [[unlikely]]
      stop_source_.reset();
    note_deadline();
    return ended;
  }

  // ---- the lease --------------------------------------------------------

  // What a timer wake-up must do at `now`: declare the lease lost, start a
  // heartbeat, and when to come back (nothing: the grant ended).
  struct Due {
    std::optional<LostNotice> lost;
    std::optional<Grant> beat;
    std::optional<time_point> next_wakeup;
  };
  Due on_timer(time_point now) {
    LightLock lock(mutex_);
    Due due;
    if (!held_ || lost_) return due;
    if (past_deadline(now)) {
      due.lost = lose(deadline_passed(now));
      return due;
    }
    if (!beat_in_flight_ && now >= next_beat_at_) {
      beat_in_flight_ = true;
      due.beat = Grant{fence_, token_, generation_, durable_due(now)};
    }
    due.next_wakeup = next_wakeup();
    return due;
  }

  // The grant a manual heartbeat of `generation` is for, if it may go out
  // (the automatic ones are started by on_timer).
  Result<Grant> beat_grant(std::uint64_t generation, time_point now) const {
    LightLock lock(mutex_);
    if (!held_ || generation != generation_) return fail(Errc::lock_not_held, "not held through this object");
    if (lost_) return fail(Errc::lock_not_held, lost_reason_.message());
    return Grant{fence_, token_, generation_, durable_due(now)};
  }

  // A beat that on_timer started could not go out (no thread or memory for
  // it, a backend that would not take it): it is due again at `retry_at`.
  // Returns when to wake up next (while a beat was in flight, the wake-up
  // armed was the lease deadline: without a nearer one no beat would come).
  time_point beat_not_started(time_point retry_at) noexcept {
    LightLock lock(mutex_);
    beat_in_flight_ = false;
    next_beat_at_ = retry_at;
    return next_wakeup();
  }

  // The answer to a heartbeat of grant `g` sent at `sent`, read at `now`.
  // `next_after_success`: when the next one is due after a good answer.
  struct Applied {
    std::optional<LostNotice> lost;
    std::optional<time_point> next_wakeup;
    std::optional<time_point> renewed;  // the lease deadline, if this answer moved it
    int failures = 0;
    bool reannounce = false;  // the announcement is due again (see note_announced)
  };
  Applied apply_beat(const Grant& g, time_point sent, time_point now, const Result<void>& answer, bool automatic,
                     duration interval, duration retry_base, ServerSession at) {
    LightLock lock(mutex_);
    Applied out;
    if (automatic && g.generation == generation_) beat_in_flight_ = false;
    if (!held_ || lost_ || g.generation != generation_) return out;
    if (past_deadline(now)) {
      // The deadline passed before this answer was read (a paused process, a
      // late timer): lost, whatever the answer says. Never un-lose: a reader
      // may already have been told.
      Error why = deadline_passed(now);
      if (!answer) why.detail += "; last error: " + answer.error().message();
      out.lost = lose(std::move(why));
      return out;
    }
    if (answer) {
      const time_point trusted_before = trusted_send_;
      bool provisional_lifted = false;
      // Never un-lose: a late success after the deadline changes nothing (checked above).
      if (at.history != last_good_history_) {
        // A failover (or another cluster) since the last good answer: what
        // the earlier server acknowledged, durable or not, may be missing
        // here, so none of it is proof any more. This answer is: the row
        // carries our grant (instance, fence, token) on this server now, and
        // the backend committed it synchronously (BackendReportsHistory). The
        // lease counts from it alone.
        unconfirmed_.clear();
        trusted_send_ = last_good_send_ = sent;
        last_good_session_ = at.session;
        last_good_history_ = at.history;
        // Nor is what the holder announced (see note_announced).
        reannounce_due_ = announced_.has_value();
      } else {
        const bool durable = !asynchronous_ || at.durability.durable;
        if (durable) trusted_send_ = std::max(trusted_send_, sent);
        else confirm(sent, now, at);
        // A provisional grant is durable once a synchronous commit of the
        // server session that granted it is: its WAL flush passes the grant's.
        // Another session may be after a crash that took the grant back.
        if (durable && provisional_until_ != time_point::max() && at.session == provisional_session_) {
          provisional_until_ = time_point::max();
          provisional_lifted = true;
        }
        if (sent > last_good_send_) {
          last_good_send_ = sent;
          last_good_session_ = at.session;
        }
      }
      failures_ = 0;
      out.reannounce = reannounce_due_;
      if (trusted_send_ != trusted_before || provisional_lifted) {
        out.renewed = deadline();
        note_deadline();
      }
      if (automatic) next_beat_at_ = std::min(now + interval, deadline());
    } else if (answer.error() == Errc::lock_not_held) {
      out.lost = lose(Error(Errc::lease_lost, "row gone or granted to another holder: " + answer.error().detail));
      return out;
    } else {
      // Transient: retried soon, never taken as loss by itself; the deadline decides.
      out.failures = ++failures_;
      if (automatic) {
        const duration backoff = retry_base * (1 << std::min(failures_ - 1, 6));
        next_beat_at_ = std::min(now + std::min(interval, backoff), deadline());
      }
    }
    out.next_wakeup = next_wakeup();
    return out;
  }

  // ---- an election's announcement (pgmutex/leadership.hpp) ---------------
  // The value the holder of grant `generation` announced last, noted once
  // the server took it (nothing: never announced, or vacated). A grant and
  // its announcement commit in two transactions, so a promoted standby
  // (asynchronous replication) may have the one without the other: the
  // leader would lead while leader() and the observers say nobody does, or
  // show an older value. So a heartbeat answered in a new server history
  // (apply_beat) makes the value due again (Applied::reannounce), for the
  // holder to announce once more (MutexState::reannounce) until an answer
  // settles it. Announcing is idempotent and keyed by the grant, as a
  // heartbeat is: a server that has the announcement changes nothing.
  void note_announced(std::uint64_t generation, std::string value) {
    LightLock lock(mutex_);
    if (!held_ || generation != generation_) return;
    announced_ = std::move(value);
    reannounce_due_ = false;
  }
  void note_vacated(std::uint64_t generation) {
    LightLock lock(mutex_);
    if (!held_ || generation != generation_) return;
    forget_announced();
  }
  // A re-announcement that was answered: taken, or refused for good (the
  // term is over there; the next heartbeat tells). Not due any more.
  void reannounce_settled(std::uint64_t generation) {
    LightLock lock(mutex_);
    if (generation == generation_) reannounce_due_ = false;
  }
  // What to announce again for grant `generation`, if it is due and the
  // grant still held at `now`. Asked under the I/O gate, where announcements
  // go out one at a time: a proclaim's value, noted there too, is never
  // overtaken by an older one.
  struct Reannouncement {
    Grant grant;
    std::string value;
  };
  [[nodiscard]] std::optional<Reannouncement> reannouncement(std::uint64_t generation, time_point now) const {
    LightLock lock(mutex_);
    if (!reannounce_due_ || !announced_ || generation != generation_ || !held_ || lost_ || past_deadline(now))
      return std::nullopt;
    return Reannouncement{Grant{fence_, token_, generation_}, *announced_};
  }

 private:
  // Called with mutex_ held.
  void forget_announced() noexcept {
    if (announced_) [[unlikely]]
      announced_.reset();
    reannounce_due_ = false;
  }

  PGMUTEX_NOINLINE std::optional<LostNotice> expire_locked(time_point now) {
    LightLock lock(mutex_);
    if (!held_ || lost_ || !past_deadline(now)) return std::nullopt;
    return lose(deadline_passed(now));
  }

  // Called with mutex_ held after every change to held_, lost_ or
  // trusted_send_: what expire() compares `now` with. The deadline rounded
  // down to the clock's tick, so that `now` below it is before the deadline
  // for sure; none (the largest value) while no grant is held or once it is lost.
  PGMUTEX_ALWAYS_INLINE void note_deadline() noexcept {
    using tick = typename time_point::duration;
    const auto due = held_ && !lost_ ? std::chrono::floor<tick>(deadline()).time_since_epoch().count()
                                     : std::numeric_limits<typename tick::rep>::max();
    due_.store(due, std::memory_order_release);
  }

  // Called with mutex_ held, for an asynchronous commit acknowledged at
  // `answered` for a heartbeat sent at `sent`, answered in `at`.
  void confirm(time_point sent, time_point answered, const ServerSession& at) {
    if (at.session != last_good_session_) unconfirmed_.clear();  // a restart may have lost them: never confirmed
    trusted_send_ = unconfirmed_.confirm(sent, answered, at.durability, trusted_send_);
  }

  // Called with mutex_ held.
  [[nodiscard]] bool past_deadline(time_point now) const noexcept {
    return held_ && (now - trusted_send_ >= lease_ || now >= provisional_until_);
  }

  // Called with mutex_ held: when the lease ends, unless renewed.
  [[nodiscard]] time_point deadline() const noexcept { return std::min(trusted_send_ + lease_, provisional_until_); }

  // Called with mutex_ held: whether the next heartbeat must commit
  // synchronously. Asynchronous ones count only once the server shows them
  // flushed; a server whose WAL writer is slow (wal_writer_delay up to 10 s)
  // or busy may show none for longer than the lease, and the lease would be
  // lost on a healthy server. Half the lease without proof: one durable beat.
  [[nodiscard]] bool durable_due(time_point now) const noexcept {
    return provisional_until_ != time_point::max() || (asynchronous_ && now - trusted_send_ >= lease_ / 2);
  }

  // Called with mutex_ held: why a lease whose deadline passed at `now` is lost.
  Error deadline_passed(time_point now) const {
    if (now - trusted_send_ < lease_)  // the provisional end (begin)
      return Error(Errc::lease_lost,
                   "the grant a queued wait confirmed without waiting for the server's WAL flush was not shown durable"
                   " in time: no heartbeat committed synchronously in the server session that granted it within " +
                       seconds(provisional_until_ - provisional_since_) +
                       " (a reconnect, or a server crash that may have taken the grant back)");
    std::string why = "no successful heartbeat for " + seconds(now - trusted_send_) + " (lease " + seconds(lease_) + ")";
    if (trusted_send_ != last_good_send_)
      why += "; the last, " + seconds(now - last_good_send_) +
             " ago, is not yet known to be durable (heartbeats commit asynchronously; the server has not yet"
             " shown it flushed)";
    return Error(Errc::lease_lost, std::move(why));
  }

  // Called with mutex_ held.
  LostNotice lose(Error reason) {
    lost_ = true;
    note_deadline();
    lost_reason_ = reason;
    return LostNotice{stop_source_, std::move(reason)};
  }

  // Called with mutex_ held: the lease deadline always; the next beat too
  // unless one is on its way (its answer schedules the next).
  time_point next_wakeup() const noexcept {
    return beat_in_flight_ ? deadline() : std::min(next_beat_at_, deadline());
  }

  static std::string seconds(duration d) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1fs", std::chrono::duration<double>(d).count());
    return text;
  }
  template <class D>
  static std::string seconds(D d) {
    return seconds(std::chrono::duration_cast<duration>(d));
  }

  const duration lease_;
  const bool asynchronous_;
  mutable LightMutex mutex_;
  // The deadline of the grant held and not lost, in the clock's ticks (see
  // note_deadline): written under mutex_, read by expire() without it. A
  // read racing a change on another thread is a read from just before it,
  // as if it had taken the lock first.
  std::atomic<typename time_point::rep> due_{std::numeric_limits<typename time_point::rep>::max()};
  bool held_ = false;
  bool lost_ = false;
  bool beat_in_flight_ = false;
  int failures_ = 0;
  Fence fence_ = 0;
  GrantToken token_ = 0;
  std::uint64_t generation_ = 0;       // bumped per grant and per release: stale guards and tasks see a mismatch
  time_point last_good_send_{};        // send time of the last heartbeat (or acquire) the server accepted
  std::uint64_t last_good_session_ = 0;  // the server session that acknowledged last_good_send_
  std::uint64_t last_good_history_ = 0;  // the server history that acknowledged last_good_send_
  UnconfirmedBeats<time_point> unconfirmed_;  // asynchronous: good sends of this session not yet confirmed durable
  std::vector<std::uint64_t> ended_lost_;  // grants that ended lost while their guards live
  time_point trusted_send_{};          // the one the lease counts from: the last, or with asynchronous commits the last confirmed durable
  time_point next_beat_at_{};
  // A provisional grant's end (begin), the largest value once durable or
  // for a durable grant; the server session that granted it; its send.
  time_point provisional_until_ = time_point::max();
  std::uint64_t provisional_session_ = 0;
  time_point provisional_since_{};
  std::optional<std::stop_source> stop_source_;
  Error lost_reason_;
  std::optional<std::string> announced_;  // an election's value, as the server took it (see note_announced)
  bool reannounce_due_ = false;          // a new server history may lack announced_
};

}  // namespace pgmutex::detail
