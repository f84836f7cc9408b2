// ThreadExecutor (pgmutex/executor.hpp): one timer thread for every mutex's
// wake-ups, and posts to the I/O pool.
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "io_pool.hpp"
#include "pgmutex/executor.hpp"

namespace pgmutex {
namespace {

class TimerThread {
 public:
  TimerThread() : thread_([this] { run(); }) { thread_.detach(); }

  TaskId schedule_after(std::chrono::nanoseconds delay, Task task) {
    std::lock_guard lock(mutex_);
    const TaskId id = ++last_id_;
    const auto due = std::chrono::steady_clock::now() + delay;
    const auto it = queue_.emplace(Key{due, id}, std::move(task)).first;
    index_.emplace(id, it->first);
    if (it == queue_.begin()) wake_.notify_one();
    return id;
  }

  void cancel(TaskId id) {
    std::unique_lock lock(mutex_);
    if (const auto found = index_.find(id); found != index_.end()) {
      queue_.erase(found->second);
      index_.erase(found);
      return;
    }
    // Running now on the timer thread: wait for it, unless we are it.
    if (running_ == id && std::this_thread::get_id() != timer_thread_id_)
      done_.wait(lock, [&] { return running_ != id; });
  }

 private:
  struct Key {
    std::chrono::steady_clock::time_point due;
    TaskId id;
    bool operator<(const Key& other) const { return due != other.due ? due < other.due : id < other.id; }
  };

  void run() {
    std::unique_lock lock(mutex_);
    timer_thread_id_ = std::this_thread::get_id();
    for (;;) {
      if (queue_.empty()) {
        wake_.wait(lock);
        continue;
      }
      const auto first = queue_.begin();
      // A copy: cancel() may erase this entry while we wait.
      const auto due = first->first.due;
      if (due > std::chrono::steady_clock::now()) {
        wake_.wait_until(lock, due);
        continue;
      }
      Task task = std::move(first->second);
      running_ = first->first.id;
      index_.erase(first->first.id);
      queue_.erase(first);
      lock.unlock();
      try {
        task();
      } catch (...) {
        // A task must not take the timer thread down with it; mutex tasks never throw.
      }
      task = nullptr;
      lock.lock();
      running_ = 0;
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::map<Key, Task> queue_;
  std::unordered_map<TaskId, Key> index_;
  TaskId last_id_ = 0;
  TaskId running_ = 0;
  std::thread::id timer_thread_id_;
  std::thread thread_;
};

// Leaked on purpose: mutexes with static storage may still cancel tasks while
// the process exits, so the timer thread must outlive every static object.
TimerThread& timer_thread() {
  static TimerThread* const instance = new TimerThread();
  return *instance;
}

}  // namespace

TaskId ThreadExecutor::schedule_after(std::chrono::nanoseconds delay, Task task) {
  return timer_thread().schedule_after(delay, std::move(task));
}

void ThreadExecutor::cancel(TaskId id) { timer_thread().cancel(id); }

void ThreadExecutor::post(Task task) { detail::post_to_io_pool(std::move(task)); }

bool ThreadExecutor::wait_for(std::chrono::nanoseconds delay, std::stop_token stop) {
  std::mutex mutex;
  std::condition_variable_any never_notified;
  std::unique_lock lock(mutex);
  return never_notified.wait_for(lock, stop, delay, [] { return false; }) || stop.stop_requested();
}

}  // namespace pgmutex
