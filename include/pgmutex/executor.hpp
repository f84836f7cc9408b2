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

// Run `task` soon, off the timer: it may block (a statement). The heartbeat's
// I/O and the lost notification (stop callbacks, the `lost` hook) go here, so
// that a hung statement or a slow callback never delays a timer: the lease
// deadline of every mutex keeps firing on time. All or nothing: if post
// throws, the task was not queued and never runs (the caller takes back what
// it gave the task); if it returns, the task runs exactly once.
template <class E>
concept ExecutorPosts = requires(E& e, Task task) {
  { e.post(std::move(task)) } -> std::same_as<void>;
};

template <class E>
concept Executor = std::copyable<E> && ExecutorSchedules<E> && ExecutorWaits<E> && ExecutorPosts<E>;

// One timer thread shared by every mutex in the process (not a thread per
// mutex), whose tasks never do I/O; posted tasks run on a pool of I/O threads
// that grows while every thread is busy (a hung statement takes one thread,
// never the others' turn) and shrinks when they idle. An empty handle: copies
// are free and all reach the same threads. post throws only std::bad_alloc,
// when it could not queue the task; a thread it cannot create (no threads
// left) is no error: the task waits for a free thread, or for the thread
// that the timer thread tries to create again soon after.
class ThreadExecutor {
 public:
  TaskId schedule_after(std::chrono::nanoseconds delay, Task task);
  void cancel(TaskId id);
  bool wait_for(std::chrono::nanoseconds delay, std::stop_token stop);
  void post(Task task);
};

}  // namespace pgmutex
