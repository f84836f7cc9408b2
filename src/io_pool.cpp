#include "io_pool.hpp"

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
  void post(Task task) {
    std::unique_lock lock(mutex_);
    queue_.push_back(std::move(task));
    if (idle_ >= queue_.size()) {
      work_.notify_one();
      return;
    }
    // Every thread is busy (or about to take a queued task): one more.
    lock.unlock();
    if (fail_thread_creation_for_tests.load(std::memory_order_relaxed))
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again), "injected");
    std::thread([this] { run(); }).detach();
  }

 private:
  static constexpr auto idle_life = 30s;

  void run() {
    std::unique_lock lock(mutex_);
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
  std::size_t idle_ = 0;
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
