// async_acquire: tries until acquired, the timeout passes, or the handler's
// cancellation slot fires, without holding a thread while it waits:
//
//   try (on the I/O pool, or the backend's thread: statements.hpp) -> taken:
//   on a backend whose queue wakes async waiters (BackendQueuesAsynchronously:
//   a Session's), a place at the back of the lock's queue, then no statement
//   until the backend says our turn came or the lock may be available, then
//   a queued try; a backend that watches locks asynchronously wakes us when
//   the lock may be free (watch_async); any other is tried again after
//   poll_interval (a steady_timer on the user's loop) -> try ...
//
// Three things race to end it: a try's answer (pool thread), the deadline
// timer (the user's loop) and a cancellation (the handler's side). A small
// mutex orders them; `done_` makes the first one win. A try cannot be
// interrupted: a stop that comes during one is acted on when it returns, and
// a grant it won then is released before the operation completes with
// operation_aborted, so a cancelled acquire leaves no row behind. A stop
// also leaves the queue (a dequeue, run where statements run) before the
// handler runs, so it leaves no place behind either.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/steady_timer.hpp>

#include "pgmutex/asio/access.hpp"
#include "pgmutex/asio/completion.hpp"
#include "pgmutex/asio/error.hpp"
#include "pgmutex/asio/statements.hpp"
#include "pgmutex/backend.hpp"
#include "pgmutex/backend_election.hpp"
#include "pgmutex/leadership.hpp"
#include "pgmutex/detail/queue_wait.hpp"

namespace pgmutex::asio_detail {

template <class Mutex, class Handler>
class AcquireOp : public std::enable_shared_from_this<AcquireOp<Mutex, Handler>> {
  using Guard = typename Mutex::guard_type;
  using Backend = typename Mutex::backend_type;
  using Access = detail::AsyncAccess;
  // On a backend whose queue wakes async waiters (a Session's), the op
  // waits in line: FIFO, woken alone by the release that offers it the lock.
  static constexpr bool queues = BackendQueuesAsynchronously<Backend>;

 public:
  // `announce`: an async campaign's (asio/election_ops.hpp), kept alive by
  // the handler: every try carries its value, so that the grant and its
  // announcement are one statement, and announce->announced says whether
  // the grant the handler gets was announced.
  AcquireOp(Mutex mutex, Handler handler, const boost::asio::any_io_executor& loop,
            std::optional<std::chrono::nanoseconds> timeout, GrantAnnouncement* announce = nullptr)
      : mutex_(std::move(mutex)), completion_(std::move(handler), loop), poll_timer_(std::in_place, loop),
        deadline_(std::in_place, loop), timeout_(timeout), announce_(announce) {}

  void start() {
    auto self = this->shared_from_this();
    std::lock_guard lock(m_);
    if (auto slot = completion_.cancellation_slot(); slot.is_connected())
      slot.assign([self](boost::asio::cancellation_type type) {
        if (type != boost::asio::cancellation_type::none) self->stop(Stop::cancelled);
      });
    if (timeout_) {
      deadline_->expires_after(std::max(*timeout_, std::chrono::nanoseconds::zero()));
      deadline_->async_wait([self](boost::system::error_code ec) {
        if (!ec) self->stop(Stop::timed_out);
      });
    }
    try_soon();
  }

 private:
  enum class Stop { cancelled, timed_out };

  // Called from anywhere, with or without m_ (a watch may wake us inside
  // watch_async), even after finish(): state_m_, a leaf lock, keeps the
  // state alive while the try is handed over.
  void try_soon() {
    auto self = this->shared_from_this();
    std::lock_guard lock(state_m_);
    auto* state = Access::state_of(mutex_);  // null once finished: the pool's try finds done_
    run_statements(state != nullptr ? &state->io.backend : nullptr,
                   [self] {
                     std::lock_guard lock(self->state_m_);
                     auto* s = Access::state_of(self->mutex_);
                     return s != nullptr && s->io_busy();
                   },
                   [self] { self->attempt(); });
  }

  // A plain try, or a queued one once the op has a place in the lock's
  // queue (a backend that queues async waiters: BackendQueuesAsynchronously).
  // A plain try that lost takes a place at once, in the same turn.
  void attempt() {
    {
      std::unique_lock lock(m_);
      if (done_ || leaving_) return;
      if (cancelled_) return leave_then_finish(lock);
      trying_ = true;
      watch_.reset();
      queue_waiting_ = false;
    }
    auto* state = Access::state_of(mutex_);  // stable: only finish() moves mutex_, never during a try
    bool place_lost = false;
    std::optional<WatchRequest> line_watch;  // a queued waiter's, from the try's answer
    std::optional<Error> refused_place;      // an enqueue that failed for good (a privilege, the schema)
    Result<Guard> got = [&] {
      if constexpr (BackendElectsInOneStatement<Backend>) {
        if (announce_ != nullptr) {
          if constexpr (queues) {
            if (queued_) return state->try_acquire_queued(*queued_, place_lost, announce_);
          }
          return state->try_acquire(announce_);
        }
      }
      if constexpr (queues) {
        if (queued_) return state->try_acquire_queued(*queued_, place_lost);
      }
      return mutex_.try_acquire(nothrow);
    }();
    if constexpr (queues) {
      if (got && !*got && !place_lost && !in_grace(*got)) {
        if (!queued_) {
          // Failed for a while (the connection): a plain try again after a
          // poll interval. For good: the op's error, as the blocking wait's.
          auto place = state->io.enqueue();
          if (place) queued_ = std::move(*place);
          else if (place.error() != Errc::backend_unavailable && place.error() != Errc::outcome_unknown)
            refused_place = std::move(place.error());
        }
        if (queued_) line_watch = detail::QueueWait::line_watch_of(*state, *got);
      }
    }
    std::unique_lock lock(m_);
    trying_ = false;
    tried_ = true;
    if (place_lost) queued_.reset();  // in line again, at the back: the next plain try
    if (got && *got) queued_.reset();  // the grant took the place
    if (cancelled_) {
      if (got && *got) {
        lock.unlock();
        // Won as the cancellation came: leave no row behind, nor a term announced.
        if (announce_ != nullptr && announce_->announced) (void)detail::ElectionAccess::release_vacating(*got);
        else (void)got->release(nothrow);
        lock.lock();
      }
      return leave_then_finish(lock);
    }
    if (got && *got) return finish(lock, {}, std::move(*got));
    const bool transient =
        !got && (got.error() == Errc::backend_unavailable || got.error() == Errc::outcome_unknown);
    if (!got && !transient) {
      last_error_ = got.error();
      return leave_then_finish(lock);
    }
    if (got) {
      holder_ = got->holder();
      last_error_.reset();
    } else {
      last_error_ = got.error();
    }
    if (refused_place) last_error_ = std::move(*refused_place);
    if (timed_out_ || refused_place) return leave_then_finish(lock);
    if constexpr (queues) {
      if (queued_) return wait_in_line(lock, line_watch);
      if (place_lost) {  // taken again at once: a plain try, then a place at the back
        lock.unlock();
        return try_soon();
      }
    }
    wait_then_try(got.has_value());
  }

  // In the lock's queue: woken by the backend when our turn comes or the
  // lock may be available (no statement meanwhile); a failed queued try or
  // a failover grace: a queued try again after a poll interval. Called with
  // m_ held (released by the call).
  void wait_in_line(std::unique_lock<std::mutex>& lock, const std::optional<WatchRequest>& line_watch) {
    auto* state = Access::state_of(mutex_);
    if (queued_->place.try_now) {  // the lock was available as we queued
      queued_->place.try_now = false;
      lock.unlock();
      return try_soon();
    }
    if (line_watch) {
      queue_waiting_ = true;
      auto waiting = state->io.backend.wait_in_queue_async(
          *line_watch, queued_->place.ticket, [self = this->shared_from_this()](QueueWake) { self->try_soon(); });
      if (waiting) return;
      queue_waiting_ = false;
    }
    poll_timer_->expires_after(state->options.poll_interval);
    poll_timer_->async_wait([self = this->shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->try_soon();
    });
  }

  // Ends the operation as stopped (or with the last try's error), first
  // leaving the queue if the op has a place there: the dequeue is a
  // statement, so it runs where statements run, and the handler after it.
  void leave_then_finish(std::unique_lock<std::mutex>& lock) {
    if constexpr (queues) {
      if (queued_) {
        leaving_ = true;
        auto* state = Access::state_of(mutex_);
        lock.unlock();
        run_statements_of(state, [self = this->shared_from_this(), state] {
          std::unique_lock relock(self->m_);
          auto place = std::move(self->queued_);
          self->queued_.reset();
          relock.unlock();
          if (place) (void)state->io.dequeue(*place);  // failed: the place lapses by itself
          relock.lock();
          self->leaving_ = false;
          self->finish_after_stop(relock);
        });
        return;
      }
    }
    finish_after_stop(lock);
  }

  // The last try's error if it was not transient, else as finish_stopped.
  void finish_after_stop(std::unique_lock<std::mutex>& lock) {
    if (!cancelled_ && !timed_out_ && last_error_) return finish(lock, to_error_code(*last_error_), Guard());
    finish_stopped(lock);
  }

  template <class G>
  static bool in_grace(const G& refused) noexcept {
    return refused.holder() && refused.holder()->failover_grace_left_s > 0;
  }

  // Called with m_ held, after a try found the lock taken (or the backend away).
  void wait_then_try(bool answered) {
    auto* state = Access::state_of(mutex_);
    if constexpr (BackendWatchesLocksAsynchronously<Backend>) {
      // Refused by a failover grace: no release will be announced, so poll.
      if (answered && !(holder_ && holder_->failover_grace_left_s > 0)) {
        const auto& o = state->options;
        WatchRequest watch{LockRef{o.table, o.lock_name}, o.stale_threshold, std::nullopt};
        if (holder_) {
          const auto age = std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::duration<double>(holder_->seconds_since_heartbeat));
          watch.holder_stale_in = holder_stale_look_in(o.stale_threshold, age);
        }
        // `woken` only queues a try: it takes no lock, so it may run anywhere, even inside watch_async.
        auto id = state->io.backend.watch_async(watch, [self = this->shared_from_this()] { self->try_soon(); });
        if (id) {
          watch_ = *id;
          return;
        }
      }
    }
    poll_timer_->expires_after(state->options.poll_interval);
    poll_timer_->async_wait([self = this->shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->try_soon();
    });
  }

  void stop(Stop why) {
    std::unique_lock lock(m_);
    if (done_ || leaving_) return;
    (why == Stop::cancelled ? cancelled_ : timed_out_) = true;
    // A try in flight (or the first, not yet made) ends it when it returns.
    if (trying_ || (why == Stop::timed_out && !tried_)) return;
    if constexpr (queues) {
      // Woken meanwhile (its try is queued): that try ends it.
      if (queue_waiting_ && !Access::state_of(mutex_)->io.backend.cancel_queue_wait(lock_ref(), queued_->place.ticket))
        return;
      queue_waiting_ = false;
    }
    leave_then_finish(lock);
  }

  LockRef lock_ref() {
    const auto& o = Access::state_of(mutex_)->options;
    return LockRef{o.table, o.lock_name};
  }

  // Cancelled: operation_aborted. Timed out: an empty guard that says so, as
  // the blocking acquire returns; or the error, if the backend never answered.
  void finish_stopped(std::unique_lock<std::mutex>& lock) {
    if (cancelled_)
      return finish(lock, boost::asio::error::operation_aborted, Access::empty_guard<Guard>(Errc::cancelled, holder_));
    if (last_error_) return finish(lock, to_error_code(*last_error_), Guard());
    finish(lock, {}, Access::empty_guard<Guard>(Errc::timeout, holder_));
  }

  // Once the handler may run, the user may destroy the mutex and then the
  // loop: the op keeps neither. Its timers go now (their waits end with
  // operation_aborted), and its share of the mutex before the handler is
  // queued: a late reference to the op (a queued try that will find done_)
  // then holds nothing of the user's.
  void finish(std::unique_lock<std::mutex>& lock, boost::system::error_code ec, Guard guard) {
    done_ = true;
    poll_timer_.reset();
    deadline_.reset();
    if constexpr (BackendWatchesLocksAsynchronously<Backend>) {
      if (watch_) (void)Access::state_of(mutex_)->io.backend.cancel_watch(*watch_);  // if it ran, its try finds done_
    }
    if constexpr (queues) {
      if (queue_waiting_ && queued_)  // if it ran, its try finds done_
        (void)Access::state_of(mutex_)->io.backend.cancel_queue_wait(lock_ref(), queued_->place.ticket);
      queue_waiting_ = false;
    }
    std::unique_lock state_lock(state_m_);
    Mutex share = std::move(mutex_);
    state_lock.unlock();
    lock.unlock();
    { Mutex gone = std::move(share); }  // outside m_: the last owner's close() may wait for a wake-up
    completion_.complete(ec, std::move(guard));
  }

  Mutex mutex_;  // shares the user's mutex's state; moved out (under m_ and state_m_) by finish()
  std::mutex state_m_;  // held only to read mutex_'s state and hand a try over: nothing waits under it
  Completion<Handler> completion_;
  std::mutex m_;  // everything below, and the timers' calls
  std::optional<boost::asio::steady_timer> poll_timer_;
  std::optional<boost::asio::steady_timer> deadline_;
  std::optional<std::chrono::nanoseconds> timeout_;
  GrantAnnouncement* announce_;  // a campaign's, or null
  std::optional<WatchId> watch_;
  std::optional<HolderInfo> holder_;  // who held it at the last try
  std::optional<Error> last_error_;   // the last try's error if it failed, or a refused enqueue's
  std::optional<detail::QueuedWaiter> queued_;  // our place in the lock's queue, while we have one
  bool queue_waiting_ = false;  // a wait_in_queue_async is registered for it
  bool leaving_ = false;        // the dequeue that ends the op is in flight
  bool done_ = false;
  bool trying_ = false;
  bool tried_ = false;
  bool cancelled_ = false;
  bool timed_out_ = false;
};

}  // namespace pgmutex::asio_detail
