// Deterministic scheduling on a ManualClock: tasks run only when time is
// advanced, in due order (ties in scheduling order), on the advancing thread.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <utility>

#include "pgmutex/executor.hpp"
#include "pgmutex/testing/manual_clock.hpp"

namespace pgmutex::testing {

class ManualExecutor {
 public:
  explicit ManualExecutor(ManualClock clock) : state_(std::make_shared<State>(std::move(clock))) {}
  ManualExecutor() : ManualExecutor(ManualClock{}) {}

  [[nodiscard]] const ManualClock& clock() const noexcept { return state_->clock; }

  // A handle on the same queue and time line whose delays are read on a
  // clock running `rate` times as fast (ManualClock::drifting): the timers of
  // a client whose clock drifts fire when its own clock says, as a real
  // client's timers follow its own clock.
  [[nodiscard]] ManualExecutor drifting(double rate) const {
    ManualExecutor e = *this;
    e.rate_ = rate;
    return e;
  }

  TaskId schedule_after(std::chrono::nanoseconds delay, Task task) {
    std::lock_guard lock(state_->mutex);
    const TaskId id = ++state_->last_id;
    state_->queue.emplace(Key{state_->clock.now() + true_delay(delay), id}, std::move(task));
    return id;
  }

  void cancel(TaskId id) {
    std::lock_guard lock(state_->mutex);
    std::erase_if(state_->queue, [id](const auto& entry) { return entry.first.id == id; });
  }

  // Posted tasks run at the current time, after the tasks already due: on the
  // advancing thread, like every task here, so a simulation stays deterministic.
  void post(Task task) { (void)schedule_after(std::chrono::nanoseconds::zero(), std::move(task)); }

  // For a simulated statement that hangs: time passes and due tasks run (the
  // lease deadlines among them) until `ready()` holds or `deadline` comes.
  // Without a deadline it gives up (false) once no task is left that could
  // make `ready()` true. Returns ready().
  template <class Ready>
  bool wait_until(std::optional<ManualClock::time_point> deadline, Ready&& ready) {
    for (;;) {
      if (ready()) return true;
      Task task;
      {
        std::lock_guard lock(state_->mutex);
        const auto first = state_->queue.begin();
        if (first == state_->queue.end() || (deadline && first->first.due > *deadline)) break;
        state_->clock.set(first->first.due);
        task = std::move(first->second);
        state_->queue.erase(first);
      }
      task();
    }
    if (deadline) state_->clock.set(*deadline);
    return ready();
  }

  // A timed wait is virtual: it advances time, running whatever falls due.
  bool wait_for(std::chrono::nanoseconds delay, std::stop_token stop) {
    if (stop.stop_requested()) return true;
    advance(true_delay(delay));
    return stop.stop_requested();
  }

  // Advance time by `d`, running each task at its due time, in order.
  void advance(std::chrono::nanoseconds d) { run_until(state_->clock.now() + d); }

  void run_until(ManualClock::time_point target) {
    for (;;) {
      Task task;
      {
        std::lock_guard lock(state_->mutex);
        const auto first = state_->queue.begin();
        if (first == state_->queue.end() || first->first.due > target) break;
        state_->clock.set(first->first.due);
        task = std::move(first->second);
        state_->queue.erase(first);
      }
      task();
    }
    state_->clock.set(target);
  }

  // Runs only the tasks already due, without moving time.
  void run_due() { run_until(state_->clock.now()); }

  [[nodiscard]] std::size_t pending() const {
    std::lock_guard lock(state_->mutex);
    return state_->queue.size();
  }

 private:
  // A delay on this handle's clock, in true time, rounded up: a timer never
  // fires before its own clock reaches the due time.
  [[nodiscard]] std::chrono::nanoseconds true_delay(std::chrono::nanoseconds d) const noexcept {
    if (rate_ == 1.0 || d <= std::chrono::nanoseconds::zero()) [[likely]]
      return d;
    return std::chrono::nanoseconds(static_cast<std::int64_t>(std::ceil(static_cast<double>(d.count()) / rate_)) + 1);
  }

  struct Key {
    ManualClock::time_point due;
    TaskId id;
    bool operator<(const Key& other) const { return due != other.due ? due < other.due : id < other.id; }
  };
  struct State {
    explicit State(ManualClock c) : clock(std::move(c)) {}
    ManualClock clock;
    mutable std::mutex mutex;
    std::map<Key, Task> queue;
    TaskId last_id = 0;
  };
  std::shared_ptr<State> state_;
  double rate_ = 1.0;
};

}  // namespace pgmutex::testing
