// The I/O threads behind ThreadExecutor::post (io_pool.hpp): one more started
// when every thread is busy; a posted task runs exactly once, or the post throws
// and it never runs.
#include "io_pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>

namespace pgmutex::detail {
namespace {

using namespace std::chrono_literals;

std::atomic<bool> fail_thread_creation_for_tests{false};

class IoPool {
 public:
  // All or nothing: only push_back may throw, and then nothing was queued.
  // Once the task is queued, nothing throws: a thread that cannot be created
  // leaves it queued for a thread that is free, or for a retry (retry()).
  void post(Task task) {
    std::unique_lock lock(mutex_);
    queue_.push_back(std::move(task));
    if (idle_ + starting_ >= queue_.size()) {
      work_.notify_one();
      return;
    }
    // Every thread is busy (or about to take a queued task): one more.
    ++starting_;
    lock.unlock();
    if (!spawn()) thread_not_created();
  }

 private:
  static constexpr auto idle_life = 30s;
  static constexpr auto first_retry = 1ms;
  static constexpr auto last_retry = 100ms;

  // Creates a thread whose turn was counted in starting_. False if it could not be.
  bool spawn() noexcept {
    try {
      if (fail_thread_creation_for_tests.load(std::memory_order_relaxed)) [[unlikely]]
        throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                                "thread creation failed (injected)");
      std::thread([this] { run(); }).detach();
      return true;
    } catch (...) {  // std::system_error (no threads left) or std::bad_alloc
      return false;
    }
  }

  // The thread counted in starting_ does not exist: the timer thread tries
  // again soon, unless a retry is due already.
  void thread_not_created() noexcept {
    std::unique_lock lock(mutex_);
    --starting_;
    if (retry_pending_) return;
    retry_pending_ = true;
    const auto delay = retry_delay_;
    retry_delay_ = std::min<std::chrono::nanoseconds>(retry_delay_ * 2, last_retry);
    lock.unlock();
    try {
      // A timer task: it does no I/O, it only creates threads.
      ThreadExecutor{}.schedule_after(delay, [this] { retry(); });
    } catch (...) {  // no memory for the timer: the next post or the next free thread will see the backlog
      lock.lock();
      retry_pending_ = false;
    }
  }

  // On the timer thread: a thread for every queued task that none will take.
  void retry() noexcept {
    std::unique_lock lock(mutex_);
    retry_pending_ = false;
    while (idle_ + starting_ < queue_.size()) {
      ++starting_;
      lock.unlock();
      if (!spawn()) return thread_not_created();
      lock.lock();
    }
    retry_delay_ = first_retry;
  }

  void run() {
    std::unique_lock lock(mutex_);
    --starting_;
    for (;;) {
      ++idle_;
      const bool got = work_.wait_for(lock, idle_life, [&] { return !queue_.empty(); });
      --idle_;
      if (!got) return;
      Task task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      try {
        task();
      } catch (...) {
        // A task must not take its thread down; mutex tasks never throw.
      }
      task = nullptr;  // destroyed outside the lock: its captures may post again
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_;
  std::deque<Task> queue_;
  std::size_t idle_ = 0;      // threads waiting for a task
  std::size_t starting_ = 0;  // threads created (or being created) that have not started waiting yet
  bool retry_pending_ = false;
  std::chrono::nanoseconds retry_delay_ = first_retry;
};

// Leaked on purpose, like the timer thread: detached threads use it until the process ends.
IoPool& pool() {
  static IoPool* const instance = new IoPool();
  return *instance;
}

}  // namespace

void post_to_io_pool(Task task) { pool().post(std::move(task)); }

void testing::fail_thread_creation(bool fail) noexcept {
  fail_thread_creation_for_tests.store(fail, std::memory_order_relaxed);
}

}  // namespace pgmutex::detail
