// detail::HungConnections: the connections of a MemoryServer whose statements
// hang (a row lock held elsewhere, a frozen peer) until a test unhangs them or
// their timeout passes. How a hung statement waits is the server's time
// model: real time blocks the thread on a condition variable, virtual time
// lets the simulation run meanwhile (the Waiter the server sets). Not part
// of the API.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "pgmutex/detail/light_mutex.hpp"
#include "pgmutex/error.hpp"

namespace pgmutex::detail {

class HungConnections {
 public:
  // How a hung statement waits: until `ready()` or its timeout (none: no
  // limit); returns ready().
  using Waiter =
      std::function<bool(std::optional<std::chrono::nanoseconds> timeout, const std::function<bool()>& ready)>;

  void set_waiter(Waiter waiter) { waiter_ = std::move(waiter); }

  void hang(std::string_view connection) {
    {
      std::lock_guard lock(mutex_);
      hung_.emplace(connection);
    }
    any_.store(true, std::memory_order_release);
  }
  void unhang(std::string_view connection) {
    {
      std::lock_guard lock(mutex_);
      if (const auto it = hung_.find(connection); it != hung_.end()) hung_.erase(it);
      any_.store(!hung_.empty(), std::memory_order_release);
    }
    unhung_.notify_all();
  }
  // How many statements are hanging now.
  [[nodiscard]] int hanging() const {
    std::lock_guard lock(mutex_);
    return hanging_;
  }

  // Whether any connection hangs: one atomic read on every statement's path.
  PGMUTEX_ALWAYS_INLINE bool any() const noexcept { return any_.load(std::memory_order_acquire); }

  // Waits while `connection` hangs. An error if its timeout passed first.
  PGMUTEX_NOINLINE std::optional<Error> wait_if_hung(std::string_view connection, std::chrono::nanoseconds timeout) {
    {
      std::lock_guard lock(mutex_);
      if (!hung_.contains(connection)) return std::nullopt;
      ++hanging_;
    }
    std::optional<std::chrono::nanoseconds> limit;
    if (timeout > std::chrono::nanoseconds::zero()) limit = timeout;
    const bool released = waiter_(limit, [&] { return !hung_.contains(connection); });
    {
      std::lock_guard lock(mutex_);
      --hanging_;
    }
    if (released) return std::nullopt;
    return Error(Errc::backend_unavailable,
                 "connection '" + std::string(connection) + "' hung: " +
                     (limit ? "statement timed out after " + std::to_string(std::chrono::duration<double>(*limit).count()) + "s"
                            : std::string("nothing left that could release it")));
  }

  // `ready` (which reads the hung connections) with the lock held: for a Waiter.
  bool locked(const std::function<bool()>& ready) {
    std::lock_guard lock(mutex_);
    return ready();
  }
  // The real-time Waiter: blocks until unhang() makes `ready` true, or the timeout.
  bool wait_real_time(std::optional<std::chrono::nanoseconds> timeout, const std::function<bool()>& ready) {
    std::unique_lock lock(mutex_);
    if (!timeout) {
      unhung_.wait(lock, ready);
      return true;
    }
    return unhung_.wait_for(lock, *timeout, ready);
  }

 private:
  Waiter waiter_;
  mutable std::mutex mutex_;  // a std::mutex: a real-time hang waits on a condition variable
  std::condition_variable unhung_;
  std::set<std::string, std::less<>> hung_;
  int hanging_ = 0;
  std::atomic<bool> any_{false};
};

}  // namespace pgmutex::detail
