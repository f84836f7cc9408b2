// Scheduling: the periodic heartbeat and the timed waits of a blocking acquire.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <stop_token>

namespace pgmutex {

using TaskId = std::uint64_t;
using Task = std::function<void()>;

// Run `task` once after `delay`. cancel(id): when it returns, the task is not
// running and never will (unless cancel is called from inside that task).
template <class E>
concept ExecutorSchedules = requires(E& e, std::chrono::nanoseconds delay, Task task, TaskId id) {
  { e.schedule_after(delay, std::move(task)) } -> std::same_as<TaskId>;
  { e.cancel(id) } -> std::same_as<void>;
};

// Wait up to `delay`; returns true if `stop` was requested first.
template <class E>
concept ExecutorWaits = requires(E& e, std::chrono::nanoseconds delay, std::stop_token stop) {
  { e.wait_for(delay, stop) } -> std::same_as<bool>;
};

template <class E>
concept Executor = std::copyable<E> && ExecutorSchedules<E> && ExecutorWaits<E>;

// One timer thread shared by every mutex in the process (not a thread per
// mutex). An empty handle: copies are free and all reach the same thread.
class ThreadExecutor {
 public:
  TaskId schedule_after(std::chrono::nanoseconds delay, Task task);
  void cancel(TaskId id);
  bool wait_for(std::chrono::nanoseconds delay, std::stop_token stop);
};

}  // namespace pgmutex
