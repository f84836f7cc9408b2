// The tasks a mutex runs off its caller's thread (posted heartbeats, lost-
// lease announcements, replies from a backend's thread): none starts once the
// mutex's last owner went, and closing waits for those running, so that no
// hook or statement of a mutex runs after it. Not part of the API.
#pragma once

#include <atomic>
#include <utility>

#include "pgmutex/detail/thread_locals.hpp"

namespace pgmutex::detail {

class TaskScope {
 public:
  // Runs `fn` as a task of this scope: not once shut, and wait_for_running() waits for it.
  template <class F>
  void run(F&& fn) {
    if (closed_.load(std::memory_order_acquire)) return;
    running_.fetch_add(1, std::memory_order_acq_rel);
    const TaskScope* outer = std::exchange(current(), this);
    fn();
    current() = outer;
    running_.fetch_sub(1, std::memory_order_acq_rel);
    running_.notify_all();
  }

  // No task starts from now on.
  void shut() noexcept { closed_.store(true, std::memory_order_release); }

  // Waits for the running tasks, but the one this thread is inside (a task
  // may drop the last owner). A heartbeat is bounded by its timeout; a stop
  // callback or hook is the user's, waited for as std::stop_callback's
  // destructor waits for one.
  void wait_for_running() noexcept {
    const int own = running_here() ? 1 : 0;
    for (int n = running_.load(std::memory_order_acquire); n > own; n = running_.load(std::memory_order_acquire))
      running_.wait(n, std::memory_order_acquire);
  }

  // Whether this thread is inside a task of this scope.
  bool running_here() const noexcept { return current() == this; }

 private:
  static const TaskScope*& current() noexcept { return thread_locals().task_scope; }

  std::atomic<bool> closed_{false};
  std::atomic<int> running_{0};
};

}  // namespace pgmutex::detail
