// The bookkeeping of one mutex's grant: pure state behind a short lock that
// is never held across a call out (no I/O, no user code, no executor call
// that may wait). Everything that must answer while a statement hangs (the
// guard's accessors, the lease deadline) reads it here. Not part of the API.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <vector>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>

#include "pgmutex/backend.hpp"
#include "pgmutex/detail/light_mutex.hpp"
#include "pgmutex/error.hpp"

namespace pgmutex::detail {

// What the world must be told after a lease ended by loss: the stop_source
// to stop and the reason for the `lost` hook. Delivered outside every lock.
struct LostNotice {
  std::optional<std::stop_source> stop;
  Error reason;
};

// Where a statement was answered: the server session (another after a
// reconnect or a restart) and the server history (another after a failover
// to a standby, or on another cluster: see BackendReportsHistory).
struct ServerSession {
  std::uint64_t session = 0;
  std::uint64_t history = 0;
};

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
  };

  // `asynchronous`: an acknowledged heartbeat may still be lost (the
  // backend commits heartbeats asynchronously). The lease then counts from the
  // last good send that a later one, at least `interval` after it and in the
  // same server session, confirmed to be durable: a server that crashes right
  // after acknowledging a beat keeps the one before (Postgres makes an
  // asynchronous commit durable within 3 x wal_writer_delay, 600 ms by
  // default, well inside an interval), and a restart in between shows as a
  // new session.
  GrantBook(duration lease, bool asynchronous, duration interval) noexcept
      : lease_(lease), asynchronous_(asynchronous), interval_(interval) {}

  [[nodiscard]] duration lease() const noexcept { return lease_; }

  // ---- read by the guard and the mutex: never waits for I/O ------------

  [[nodiscard]] bool holds() const noexcept {
    LightLock lock(mutex_);
    return held_ && !lost_;
  }

  // Grant `generation` is the current one, held, and not lost.
  [[nodiscard]] bool holds(std::uint64_t generation) const noexcept {
    LightLock lock(mutex_);
    return generation == generation_ && held_ && !lost_;
  }

  // An older grant whose guard is still alive was lost if it is among those
  // that ended lost (released through the mutex, or superseded by a new grant).
  [[nodiscard]] bool lost(std::uint64_t generation) const noexcept {
    LightLock lock(mutex_);
    if (generation == generation_) return held_ && lost_;
    return std::find(ended_lost_.begin(), ended_lost_.end(), generation) != ended_lost_.end();
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
    return stop_source_->get_token();
  }

  [[nodiscard]] std::optional<Grant> current() const noexcept {
    LightLock lock(mutex_);
    if (!held_ || lost_) return std::nullopt;
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
  // row, on our clock, never later). Returns its generation.
  std::uint64_t begin(Fence fence, GrantToken token, time_point sent, time_point next_beat, ServerSession at) {
    LightLock lock(mutex_);
    if (held_ && lost_) ended_lost_.push_back(generation_);  // its guard still answers lost()
    last_good_session_ = at.session;
    last_good_history_ = at.history;
    recent_.clear();
    held_ = true;
    lost_ = false;
    fence_ = fence;
    token_ = token;
    ++generation_;
    failures_ = 0;
    beat_in_flight_ = false;
    stop_source_.reset();
    last_good_send_ = trusted_send_ = sent;  // an acquire commits synchronously
    if (asynchronous_) recent_.push_back(sent);
    next_beat_at_ = std::min(next_beat, sent + lease_);
    return generation_;
  }

  // Ends the grant `generation` (released by its guard). Returns what the
  // release statement needs and whether the lease had been lost (the reason
  // stays readable through lost_reason()), or nothing if that grant already ended.
  struct Ended {
    Grant grant;
    bool was_lost = false;
  };
  std::optional<Ended> end(std::uint64_t generation) {
    LightLock lock(mutex_);
    if (!held_ || generation != generation_) return std::nullopt;
    Ended ended{Grant{fence_, token_, generation_}, lost_};
    if (lost_) ended_lost_.push_back(generation_);  // a guard may still ask (a release through the mutex)
    held_ = false;
    lost_ = false;
    ++generation_;  // the guard's grant is over: its lost()/stop_token() no longer apply
    stop_source_.reset();
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
    if (now - trusted_send_ >= lease_) {
      std::string why = "no successful heartbeat for " + seconds(now - trusted_send_) + " (lease " + seconds(lease_) + ")";
      if (trusted_send_ != last_good_send_)
        why += "; the last, " + seconds(now - last_good_send_) +
               " ago, is not yet known to be durable (heartbeats commit asynchronously)";
      due.lost = lose(Error(Errc::lease_lost, std::move(why)));
      return due;
    }
    if (!beat_in_flight_ && now >= next_beat_at_) {
      beat_in_flight_ = true;
      due.beat = Grant{fence_, token_, generation_};
    }
    due.next_wakeup = next_wakeup();
    return due;
  }

  // The grant a manual heartbeat of `generation` is for, if it may go out
  // (the automatic ones are started by on_timer).
  Result<Grant> beat_grant(std::uint64_t generation) const {
    LightLock lock(mutex_);
    if (!held_ || generation != generation_) return fail(Errc::lock_not_held, "not held through this object");
    if (lost_) return fail(Errc::lock_not_held, lost_reason_.message());
    return Grant{fence_, token_, generation_};
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
    int failures = 0;
  };
  Applied apply_beat(const Grant& g, time_point sent, time_point now, const Result<void>& answer, bool automatic,
                     duration interval, duration retry_base, ServerSession at) {
    LightLock lock(mutex_);
    Applied out;
    if (automatic && g.generation == generation_) beat_in_flight_ = false;
    if (!held_ || lost_ || g.generation != generation_) return out;
    if (answer) {
      // Never un-lose: a late success after the deadline changes nothing (checked above).
      if (at.history != last_good_history_) {
        // A failover (or another cluster) since the last good answer: what
        // the earlier server acknowledged, durable or not, may be missing
        // here, so none of it is proof any more. This answer is: the row
        // carries our grant (instance, fence, token) on this server now, and
        // the backend committed it synchronously (BackendReportsHistory). The
        // lease counts from it alone.
        recent_.clear();
        trusted_send_ = last_good_send_ = sent;
        last_good_session_ = at.session;
        last_good_history_ = at.history;
      } else if (sent > last_good_send_) {
        if (!asynchronous_) trusted_send_ = sent;
        else confirm(sent, at.session);
        last_good_send_ = sent;
        last_good_session_ = at.session;
      }
      failures_ = 0;
      if (automatic) next_beat_at_ = std::min(now + interval, trusted_send_ + lease_);
    } else if (answer.error() == Errc::lock_not_held) {
      out.lost = lose(Error(Errc::lease_lost, "row gone or granted to another holder: " + answer.error().detail));
      return out;
    } else {
      // Transient: retried soon, never taken as loss by itself; the deadline decides.
      out.failures = ++failures_;
      if (now - trusted_send_ >= lease_) {
        out.lost = lose(Error(Errc::lease_lost, "no successful heartbeat within the lease of " + seconds(lease_) +
                                                    "; last error: " + answer.error().message()));
        return out;
      }
      if (automatic) {
        const duration backoff = retry_base * (1 << std::min(failures_ - 1, 6));
        next_beat_at_ = std::min(now + std::min(interval, backoff), trusted_send_ + lease_);
      }
    }
    out.next_wakeup = next_wakeup();
    return out;
  }

 private:
  // Called with mutex_ held, for asynchronous commits: a good send at `sent`
  // in `session` confirms every earlier good send of the same session at
  // least an interval older (the server had time to make it durable, and did
  // not restart in between); the lease counts from the newest confirmed one.
  void confirm(time_point sent, std::uint64_t session) {
    if (session != last_good_session_) recent_.clear();  // a restart may have lost them: never confirmed
    while (!recent_.empty() && sent - recent_.front() >= interval_) {
      trusted_send_ = std::max(trusted_send_, recent_.front());
      recent_.pop_front();
    }
    if (recent_.size() == max_recent) recent_.pop_front();  // spammed manual beats: keep the newest, stay conservative
    recent_.push_back(sent);
  }

  // Called with mutex_ held.
  LostNotice lose(Error reason) {
    lost_ = true;
    lost_reason_ = reason;
    return LostNotice{stop_source_, std::move(reason)};
  }

  // Called with mutex_ held: the lease deadline always; the next beat too
  // unless one is on its way (its answer schedules the next).
  time_point next_wakeup() const noexcept {
    const time_point deadline = trusted_send_ + lease_;
    return beat_in_flight_ ? deadline : std::min(next_beat_at_, deadline);
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
  const duration interval_;
  mutable LightMutex mutex_;
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
  static constexpr std::size_t max_recent = 64;
  std::deque<time_point> recent_;        // asynchronous: good sends of this session not yet confirmed durable
  std::vector<std::uint64_t> ended_lost_;  // grants that ended lost while their guards live
  time_point trusted_send_{};          // the one the lease counts from: the last, or with asynchronous commits the last confirmed durable
  time_point next_beat_at_{};
  std::optional<std::stop_source> stop_source_;
  Error lost_reason_;
};

}  // namespace pgmutex::detail
