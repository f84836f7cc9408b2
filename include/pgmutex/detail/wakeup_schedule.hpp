// The lease timer's schedule: which wake-ups of a mutex are pending on its
// executor's timer, so that one comes by every due time asked for and none
// runs once the mutex's last owner went. Also keeps a lost-lease notice that
// could not be posted, for the next wake-up to announce. It does no I/O and
// runs no user code; its lock is held briefly, never across a task. Not part
// of the API.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "pgmutex/detail/grant_book.hpp"
#include "pgmutex/detail/light_mutex.hpp"
#include "pgmutex/executor.hpp"

namespace pgmutex::detail {

template <class TimePoint>
class WakeupSchedule {
 public:
  using time_point = TimePoint;
  using duration = std::chrono::nanoseconds;

  // Makes sure a wake-up comes by `due`: schedules `make_task(id)` on the
  // executor unless a pending one comes no later. Nothing once closed. May
  // throw (no memory) before anything is scheduled, never after.
  //
  // Every grant arms one, and one is nearly always pending already: that
  // case reads one atomic and takes no lock. A wake-up that is starting
  // meanwhile is safe to miss: starting() drops it from earliest_ before it
  // reads the book, and the grant was entered in the book before arm() was
  // called, so it either sees the grant and arms for it, or its update of
  // earliest_ (ordered before its book lock) is seen here.
  template <class Ex, class MakeTask>
  PGMUTEX_ALWAYS_INLINE void arm(Ex& executor, time_point due, time_point now, MakeTask&& make_task) {
    if (due.time_since_epoch().count() >= earliest_.load(std::memory_order_acquire)) [[likely]]
      return;
    arm_locked(executor, due, now, std::forward<MakeTask>(make_task));
  }

  // A wake-up starts: false once closed (it must do nothing). Its entry
  // stays, marked running, until finished(), so that a close() meanwhile
  // cancels it, which waits for it to end.
  bool starting(std::uint64_t id) noexcept {
    LightLock lock(mutex_);
    if (closing_) return false;
    for (Wakeup& w : pending_)
      if (w.id == id) w.running = true;
    note_earliest();
    return true;
  }
  void finished(std::uint64_t id) noexcept {
    LightLock lock(mutex_);
    std::erase_if(pending_, [id](const Wakeup& w) { return w.id == id; });
    note_earliest();
  }

  // No wake-up may be armed from now on; the pending ones are cancelled
  // (cancel() waits for one that is running).
  template <class Ex>
  void close(Ex& executor) noexcept {
    std::vector<Wakeup> pending;
    {
      LightLock lock(mutex_);
      closing_ = true;
      pending.swap(pending_);
      note_earliest();
    }
    for (const Wakeup& w : pending) executor.cancel(w.task);
  }

  // A lost lease whose announcement could not be posted: the next wake-up takes it.
  void keep_unannounced(LostNotice notice) noexcept {
    LightLock lock(mutex_);
    unannounced_ = std::move(notice);
  }
  std::optional<LostNotice> take_unannounced() noexcept {
    LightLock lock(mutex_);
    return std::exchange(unannounced_, std::nullopt);
  }

 private:
  struct Wakeup {
    std::uint64_t id;
    TaskId task;
    time_point due;
    bool running;
  };
  using rep = typename time_point::rep;

  template <class Ex, class MakeTask>
  PGMUTEX_NOINLINE void arm_locked(Ex& executor, time_point due, time_point now, MakeTask&& make_task) {
    LightLock lock(mutex_);
    if (closing_) return;
    for (const Wakeup& w : pending_)
      if (!w.running && w.due <= due) return;
    const std::uint64_t id = ++last_id_;
    const auto delay = std::max(duration::zero(), std::chrono::duration_cast<duration>(due - now));
    pending_.reserve(pending_.size() + 1);
    const TaskId task = executor.schedule_after(delay, make_task(id));
    pending_.push_back(Wakeup{id, task, due, false});
    note_earliest();
  }

  // Under mutex_: the earliest due of the pending wake-ups not yet running.
  void note_earliest() noexcept {
    rep earliest = std::numeric_limits<rep>::max();
    for (const Wakeup& w : pending_)
      if (!w.running) earliest = std::min(earliest, w.due.time_since_epoch().count());
    earliest_.store(earliest, std::memory_order_release);
  }

  LightMutex mutex_;
  std::vector<Wakeup> pending_;  // one, but for a moment after a re-grant
  std::uint64_t last_id_ = 0;
  bool closing_ = false;
  std::optional<LostNotice> unannounced_;
  std::atomic<rep> earliest_{std::numeric_limits<rep>::max()};  // see note_earliest()
};

}  // namespace pgmutex::detail
