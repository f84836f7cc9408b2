// AsioExecutor: the Executor policy for a mutex that lives on the user's
// Asio event loop (AsioMutex, <pgmutex/asio.hpp>).
//   - schedule_after, cancel: the lease timer and the heartbeat's cadence run
//     on ThreadExecutor's timer thread, which does no I/O, never on the
//     user's loop: a busy or blocked loop (a CPU-bound handler on a
//     single-threaded io_context) delays neither the lease deadline nor the
//     heartbeats. Only the notifications reach the loop: the guard's stop
//     token is stopped off the loop at the deadline, and async_wait_lost
//     posts just its completion to the handler's executor;
//   - post, wait_for: statements may block, so they never run on the user's
//     loop: they go to ThreadExecutor's I/O pool;
//   - the async forms of the mutex and its guard (async_ops.hpp).
#pragma once

#include <chrono>
#include <optional>
#include <type_traits>
#include <stop_token>
#include <string>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "pgmutex/asio/async_ops.hpp"
#include "pgmutex/asio/election_ops.hpp"
#include "pgmutex/asio/singleton_op.hpp"
#include "pgmutex/executor.hpp"

namespace pgmutex {

class AsioExecutor {
 public:
  // A timer made (and dropped) on the loop starts its context's reactor, as
  // the mutex's timers did when they lived there: an idle loop then waits in
  // the reactor, which a post from pgmutex's threads wakes under the
  // scheduler's lock, not on a condition variable signalled after it (which
  // races with an io_context destroyed as soon as its last handler ran).
  explicit AsioExecutor(boost::asio::any_io_executor loop) : loop_(std::move(loop)) {
    (void)boost::asio::steady_timer(loop_);
  }

  [[nodiscard]] const boost::asio::any_io_executor& get_executor() const noexcept { return loop_; }

  // On the timer thread (tasks that do no I/O), not on the user's loop.
  TaskId schedule_after(std::chrono::nanoseconds delay, Task task) {
    return ThreadExecutor{}.schedule_after(delay, std::move(task));
  }
  // When it returns, the task is not running and never will, unless called
  // from inside that task: a task running on another thread is waited for.
  void cancel(TaskId id) { ThreadExecutor{}.cancel(id); }
  bool wait_for(std::chrono::nanoseconds delay, std::stop_token stop) { return ThreadExecutor{}.wait_for(delay, std::move(stop)); }
  void post(Task task) { ThreadExecutor{}.post(std::move(task)); }

  // ---- what BasicMutex's and BasicGuard's async members forward to
  template <class Mutex, class Token>
  static auto async_create_schema(Mutex& mutex, Token&& token) {
    return asio_detail::async_create_schema(mutex, std::forward<Token>(token));
  }
  template <class Mutex, class F>
  static auto async_singleton(Mutex&& mutex, F fn, WaitPolicy wait) {
    return asio_detail::AsyncSingleton<std::remove_cvref_t<Mutex>, F>(std::move(mutex), std::move(fn), wait);
  }
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

  // ---- what BasicElection's, BasicLeadership's and BasicObserver's async members forward to
  template <class Election, class Token>
  static auto async_campaign(Election& election, std::string value, std::optional<std::chrono::nanoseconds> timeout,
                             Token&& token) {
    return asio_detail::async_campaign(election, std::move(value), timeout, std::forward<Token>(token));
  }
  template <class Election, class Token>
  static auto async_leader(Election& election, Token&& token) {
    return asio_detail::async_leader(election, std::forward<Token>(token));
  }
  template <class Leadership, class Token>
  static auto async_proclaim(Leadership& leadership, std::string value, Token&& token) {
    return asio_detail::async_proclaim(leadership, std::move(value), std::forward<Token>(token));
  }
  template <class Leadership, class Token>
  static auto async_resign(Leadership&& leadership, Token&& token) {
    return asio_detail::async_resign(std::move(leadership), std::forward<Token>(token));
  }
  template <class Observer, class Token>
  static auto async_next(Observer& observer, std::optional<std::chrono::nanoseconds> timeout, Token&& token) {
    return asio_detail::async_next(observer, timeout, std::forward<Token>(token));
  }
  template <class Observer, class Token>
  static auto async_observe(Observer& observer, Token&& token) {
    return asio_detail::async_observe(observer, std::forward<Token>(token));
  }

 private:
  boost::asio::any_io_executor loop_;  // where handlers run by default
};

}  // namespace pgmutex
