// AsioExecutor: the Executor policy for a mutex that lives on the user's
// Asio event loop (AsioMutex, <pgmutex/asio.hpp>).
//   - schedule_after: the lease timer and the heartbeat's cadence are
//     steady_timers on the user's executor (they do no I/O);
//   - post, wait_for: statements may block, so they never run on the user's
//     loop: they go to ThreadExecutor's I/O pool;
//   - the async forms of the mutex and its guard (async_ops.hpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <unordered_map>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "pgmutex/asio/async_ops.hpp"
#include "pgmutex/executor.hpp"

namespace pgmutex {

class AsioExecutor {
 public:
  explicit AsioExecutor(boost::asio::any_io_executor loop)
      : loop_(std::move(loop)), timers_(std::make_shared<Timers>()) {}

  [[nodiscard]] const boost::asio::any_io_executor& get_executor() const noexcept { return loop_; }

  TaskId schedule_after(std::chrono::nanoseconds delay, Task task);
  // When it returns, the task is not running and never will, unless called
  // from inside that task: a task running on another thread is waited for.
  void cancel(TaskId id);
  bool wait_for(std::chrono::nanoseconds delay, std::stop_token stop) { return ThreadExecutor{}.wait_for(delay, std::move(stop)); }
  void post(Task task) { ThreadExecutor{}.post(std::move(task)); }

  // ---- what BasicMutex's and BasicGuard's async members forward to
  template <class Mutex, class Token>
  static auto async_try_acquire(Mutex& mutex, Token&& token) {
    return asio_detail::async_try_acquire(mutex, std::forward<Token>(token));
  }
  template <class Mutex, class Token>
  static auto async_acquire(Mutex& mutex, std::optional<std::chrono::nanoseconds> timeout, Token&& token) {
    return asio_detail::async_acquire(mutex, timeout, std::forward<Token>(token));
  }
  template <class Guard, class Token>
  static auto async_release(Guard&& guard, Token&& token) {
    return asio_detail::async_release(std::move(guard), std::forward<Token>(token));
  }
  template <class Guard, class Token>
  static auto async_heartbeat(Guard& guard, Token&& token) {
    return asio_detail::async_heartbeat(guard, std::forward<Token>(token));
  }
  template <class Guard, class Token>
  static auto async_wait_lost(Guard& guard, Token&& token) {
    return asio_detail::async_wait_lost(guard, std::forward<Token>(token));
  }

 private:
  // The registry behind cancel()'s promise. An entry exists from
  // scheduling until the task ends or is cancelled; `running` while it runs.
  struct Timers {
    struct Entry {
      std::shared_ptr<boost::asio::steady_timer> timer;
      bool running = false;
      std::thread::id runner;
    };
    std::mutex mutex;
    std::condition_variable ended;
    std::unordered_map<TaskId, Entry> entries;
    TaskId last = 0;
  };

  boost::asio::any_io_executor loop_;
  std::shared_ptr<Timers> timers_;
};

inline TaskId AsioExecutor::schedule_after(std::chrono::nanoseconds delay, Task task) {
  auto timer = std::make_shared<boost::asio::steady_timer>(loop_, delay);
  std::lock_guard lock(timers_->mutex);
  const TaskId id = ++timers_->last;
  timers_->entries.emplace(id, Timers::Entry{timer, false, {}});
  // Under the lock: a cancel() of this id cannot touch the timer before its wait is queued.
  timer->async_wait([timers = timers_, id, timer, task = std::move(task)](boost::system::error_code) {
    {
      std::lock_guard inner(timers->mutex);
      const auto found = timers->entries.find(id);
      if (found == timers->entries.end()) return;  // cancelled
      found->second.running = true;
      found->second.runner = std::this_thread::get_id();
    }
    try {
      task();
    } catch (...) {
      // A task must not take the user's loop down; mutex tasks never throw.
    }
    std::lock_guard inner(timers->mutex);
    timers->entries.erase(id);
    timers->ended.notify_all();
  });
  return id;
}

inline void AsioExecutor::cancel(TaskId id) {
  std::unique_lock lock(timers_->mutex);
  const auto found = timers_->entries.find(id);
  if (found == timers_->entries.end()) return;
  if (!found->second.running) {
    // Erased, it will never run; the timer is stopped on its loop (a timer
    // is not to be touched from two threads at once) to free its slot early.
    boost::asio::post(loop_, [timer = std::move(found->second.timer)] { timer->cancel(); });
    timers_->entries.erase(found);
    return;
  }
  if (found->second.runner == std::this_thread::get_id()) return;  // from inside the task
  timers_->ended.wait(lock, [&] { return !timers_->entries.contains(id); });
}

}  // namespace pgmutex
