// The bookkeeping of one mutex's grant: pure state behind a short lock that
// is never held across a call out (no I/O, no user code, no executor call
// that may wait). Everything that must answer while a statement hangs (the
// guard's accessors, the lease deadline) reads it here. Not part of the API.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
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

  explicit GrantBook(duration lease) noexcept : lease_(lease) {}

  [[nodiscard]] duration lease() const noexcept { return lease_; }

  // ---- read by the guard and the mutex: never waits for I/O ------------

  [[nodiscard]] bool holds() const noexcept {
    LightLock lock(mutex_);
    return held_ && !lost_;
  }

  // An older grant whose guard is still alive ended by loss, or it would have
  // been released before this object could acquire again.
  [[nodiscard]] bool lost(std::uint64_t generation) const noexcept {
    LightLock lock(mutex_);
    return generation == generation_ ? held_ && lost_ : generation == lost_generation_;
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
  std::uint64_t begin(Fence fence, GrantToken token, time_point sent, time_point next_beat) {
    LightLock lock(mutex_);
    held_ = true;
    lost_ = false;
    fence_ = fence;
    token_ = token;
    ++generation_;
    failures_ = 0;
    beat_in_flight_ = false;
    stop_source_.reset();
    last_good_send_ = sent;
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
    if (now - last_good_send_ >= lease_) {
      due.lost = lose(Error(Errc::lease_lost, "no successful heartbeat for " + seconds(now - last_good_send_) +
                                                  " (lease " + seconds(lease_) + ")"));
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

  // The answer to a heartbeat of grant `g` sent at `sent`, read at `now`.
  // `next_after_success`: when the next one is due after a good answer.
  struct Applied {
    std::optional<LostNotice> lost;
    std::optional<time_point> next_wakeup;
    int failures = 0;
  };
  Applied apply_beat(const Grant& g, time_point sent, time_point now, const Result<void>& answer, bool automatic,
                     duration interval, duration retry_base) {
    LightLock lock(mutex_);
    Applied out;
    if (automatic && g.generation == generation_) beat_in_flight_ = false;
    if (!held_ || lost_ || g.generation != generation_) return out;
    if (answer) {
      // Never un-lose: a late success after the deadline changes nothing (checked above).
      last_good_send_ = std::max(last_good_send_, sent);
      failures_ = 0;
      if (automatic) next_beat_at_ = std::min(now + interval, last_good_send_ + lease_);
    } else if (answer.error() == Errc::lock_not_held) {
      out.lost = lose(Error(Errc::lease_lost, "row gone or granted to another holder: " + answer.error().detail));
      return out;
    } else {
      // Transient: retried soon, never taken as loss by itself; the deadline decides.
      out.failures = ++failures_;
      if (now - last_good_send_ >= lease_) {
        out.lost = lose(Error(Errc::lease_lost, "no successful heartbeat within the lease of " + seconds(lease_) +
                                                    "; last error: " + answer.error().message()));
        return out;
      }
      if (automatic) {
        const duration backoff = retry_base * (1 << std::min(failures_ - 1, 6));
        next_beat_at_ = std::min(now + std::min(interval, backoff), last_good_send_ + lease_);
      }
    }
    out.next_wakeup = next_wakeup();
    return out;
  }

 private:
  // Called with mutex_ held.
  LostNotice lose(Error reason) {
    lost_ = true;
    lost_generation_ = generation_;
    lost_reason_ = reason;
    return LostNotice{stop_source_, std::move(reason)};
  }

  // Called with mutex_ held: the lease deadline always; the next beat too
  // unless one is on its way (its answer schedules the next).
  time_point next_wakeup() const noexcept {
    const time_point deadline = last_good_send_ + lease_;
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
  mutable LightMutex mutex_;
  bool held_ = false;
  bool lost_ = false;
  bool beat_in_flight_ = false;
  int failures_ = 0;
  Fence fence_ = 0;
  GrantToken token_ = 0;
  std::uint64_t generation_ = 0;       // bumped per grant and per release: stale guards and tasks see a mismatch
  std::uint64_t lost_generation_ = 0;  // the last grant that was lost
  time_point last_good_send_{};        // send time of the last heartbeat (or acquire) the server accepted
  time_point next_beat_at_{};
  std::optional<std::stop_source> stop_source_;
  Error lost_reason_;
};

}  // namespace pgmutex::detail
