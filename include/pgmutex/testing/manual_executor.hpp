// Deterministic scheduling on a ManualClock: tasks run only when time is
// advanced, in due order (ties in scheduling order), on the advancing thread.
// A blocking call (a mutex's acquire) can run as a simulated thread of its
// own (spawn): its waits let the rest of the world run, one thread at a time.
#pragma once

#include <functional>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <utility>

#include "pgmutex/executor.hpp"
#include "pgmutex/testing/fiber.hpp"
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

  // A handle on the same queue and time line whose tasks belong to `group`
  // (a simulated process): pause(group) holds them back, as a process
  // stopped by SIGSTOP or a timer thread that is not scheduled; they run,
  // late and in order, once resume(group) lets them.
  [[nodiscard]] ManualExecutor in_group(std::string group) const {
    ManualExecutor e = *this;
    e.group_ = std::move(group);
    return e;
  }
  void pause(const std::string& group) {
    std::lock_guard lock(state_->mutex);
    state_->paused.insert(group);
  }
  void resume(const std::string& group) {
    std::lock_guard lock(state_->mutex);
    state_->paused.erase(group);
  }

  TaskId schedule_after(std::chrono::nanoseconds delay, Task task) {
    std::lock_guard lock(state_->mutex);
    const TaskId id = ++state_->last_id;
    state_->queue.emplace(Key{state_->clock.now() + true_delay(delay), id}, Entry{std::move(task), group_});
    return id;
  }

  void cancel(TaskId id) {
    std::lock_guard lock(state_->mutex);
    std::erase_if(state_->queue, [id](const auto& entry) { return entry.first.id == id; });
  }

  // Posted tasks run at the current time, after the tasks already due: on the
  // advancing thread, like every task here, so a simulation stays deterministic.
  void post(Task task) { (void)schedule_after(std::chrono::nanoseconds::zero(), std::move(task)); }

  // Runs `body` as a simulated thread: it starts as a task posted now, and
  // each of its waits (wait_for, wait_until, advance) hands the time line
  // back, so that other tasks and threads run meanwhile, and it goes on when
  // its wait is due (later, if its group is paused: a stopped process). Only
  // one runs at a time, each a fiber on the advancing thread with a stack of
  // its own, 256 KiB (testing/fiber.hpp): runs stay deterministic. The caller
  // lets time pass until every spawned body returned (running()).
  void spawn(std::function<void()> body) {
    {
      std::lock_guard lock(state_->mutex);
      ++state_->fibers;
    }
    post([state = state_, body = std::move(body)]() mutable {
      // Held by its pending wake-up while it waits; one left waiting when
      // the world stopped waits for ever, as a thread would.
      const auto fiber = std::make_shared<detail::Fiber>([state, body = std::move(body)] {
        body();
        std::lock_guard lock(state->mutex);
        --state->fibers;
      });
      fiber->resume();
    });
  }
  // How many spawned bodies have not returned yet.
  [[nodiscard]] int running() const {
    std::lock_guard lock(state_->mutex);
    return state_->fibers;
  }

  // For a simulated statement that hangs: time passes and due tasks run (the
  // lease deadlines among them) until `ready()` holds or `deadline` comes.
  // Without a deadline it gives up (false) once no task is left that could
  // make `ready()` true. Returns ready().
  template <class Ready>
  bool wait_until(std::optional<ManualClock::time_point> deadline, Ready&& ready) {
    if (current_fiber() != nullptr) [[unlikely]] {
      // A spawned thread looks again every second of virtual time.
      for (;;) {
        if (ready()) return true;
        const auto now = state_->clock.now();
        if (deadline && now >= *deadline) return ready();
        if (!deadline && pending() == 0) return ready();
        fiber_sleep(deadline ? std::min<std::chrono::nanoseconds>(*deadline - now, std::chrono::seconds(1))
                             : std::chrono::seconds(1));
      }
    }
    for (;;) {
      if (ready()) return true;
      Task task = take_due(deadline);
      if (!task) break;
      task();
    }
    if (deadline) state_->clock.set(*deadline);
    return ready();
  }

  // A timed wait is virtual: it advances time, running whatever falls due.
  bool wait_for(std::chrono::nanoseconds delay, std::stop_token stop) {
    if (stop.stop_requested()) return true;
    if (current_fiber() != nullptr) [[unlikely]]
      fiber_sleep(delay);
    else
      advance(true_delay(delay));
    return stop.stop_requested();
  }

  // Advance time by `d`, running each task at its due time, in order (from a
  // spawned thread: lets it pass while the others run).
  void advance(std::chrono::nanoseconds d) {
    if (current_fiber() != nullptr) [[unlikely]]
      return fiber_sleep(d);
    run_until(state_->clock.now() + d);
  }

  void run_until(ManualClock::time_point target) {
    for (;;) {
      Task task = take_due(target);
      if (!task) break;
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
  static detail::Fiber* current_fiber() noexcept { return detail::Fiber::current(); }
  // In a spawned thread: the world runs for `d` (this handle's clock), then it goes on.
  void fiber_sleep(std::chrono::nanoseconds d) {
    detail::Fiber* fiber = current_fiber();
    (void)schedule_after(d, [held = fiber->shared_from_this()] { held->resume(); });
    fiber->suspend();
  }

  // The first task due by `until` (any time: nullopt) whose group is not
  // paused, taken out of the queue with time moved to its due time (never
  // back: a held task that was due before runs at the current time).
  Task take_due(std::optional<ManualClock::time_point> until) {
    std::lock_guard lock(state_->mutex);
    for (auto it = state_->queue.begin(); it != state_->queue.end(); ++it) {
      if (until && it->first.due > *until) break;
      if (!state_->paused.empty() && state_->paused.contains(it->second.group)) continue;
      state_->clock.set(it->first.due);
      Task task = std::move(it->second.task);
      state_->queue.erase(it);
      return task;
    }
    return {};
  }

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
  struct Entry {
    Task task;
    std::string group;
  };
  struct State {
    explicit State(ManualClock c) : clock(std::move(c)) {}
    ManualClock clock;
    mutable std::mutex mutex;
    std::map<Key, Entry> queue;
    std::set<std::string, std::less<>> paused;
    TaskId last_id = 0;
    int fibers = 0;  // spawned bodies still running
  };
  std::shared_ptr<State> state_;
  double rate_ = 1.0;
  std::string group_;  // "" unless in_group: never paused but by name
};

}  // namespace pgmutex::testing
