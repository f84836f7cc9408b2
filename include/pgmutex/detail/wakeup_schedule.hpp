// The lease timer's schedule: which wake-ups of a mutex are pending on its
// executor's timer, so that one comes by every due time asked for and none
// runs once the mutex's last owner went. Also keeps a lost-lease notice that
// could not be posted, for the next wake-up to announce. It does no I/O and
// runs no user code; its lock is held briefly, never across a task. Not part
// of the API.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
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
  template <class Ex, class MakeTask>
  void arm(Ex& executor, time_point due, time_point now, MakeTask&& make_task) {
    LightLock lock(mutex_);
    if (closing_) return;
    for (const Wakeup& w : pending_)
      if (!w.running && w.due <= due) return;
    const std::uint64_t id = ++last_id_;
    const auto delay = std::max(duration::zero(), std::chrono::duration_cast<duration>(due - now));
    pending_.reserve(pending_.size() + 1);
    const TaskId task = executor.schedule_after(delay, make_task(id));
    pending_.push_back(Wakeup{id, task, due, false});
  }

  // A wake-up starts: false once closed (it must do nothing). Its entry
  // stays, marked running, until finished(), so that a close() meanwhile
  // cancels it, which waits for it to end.
  bool starting(std::uint64_t id) noexcept {
    LightLock lock(mutex_);
    if (closing_) return false;
    for (Wakeup& w : pending_)
      if (w.id == id) w.running = true;
    return true;
  }
  void finished(std::uint64_t id) noexcept {
    LightLock lock(mutex_);
    std::erase_if(pending_, [id](const Wakeup& w) { return w.id == id; });
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

  LightMutex mutex_;
  std::vector<Wakeup> pending_;  // one, but for a moment after a re-grant
  std::uint64_t last_id_ = 0;
  bool closing_ = false;
  std::optional<LostNotice> unannounced_;
};

}  // namespace pgmutex::detail
