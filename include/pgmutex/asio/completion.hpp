// How every async operation here runs: its statements on the I/O pool (never
// on the user's event loop: a statement may block for its whole timeout), its
// handler on the handler's associated executor, whose loop is kept busy
// (outstanding work) until the handler has run.
#pragma once

#include <memory>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include "pgmutex/executor.hpp"

namespace pgmutex::asio_detail {

// Runs `fn` on ThreadExecutor's I/O pool. Task is a std::function, which
// copies; a handler is move-only, so the work goes behind a shared_ptr.
template <class Fn>
void run_off_loop(Fn fn) {
  ThreadExecutor{}.post([work = std::make_shared<Fn>(std::move(fn))] { (*work)(); });
}

// A handler waiting for its operation: `fallback` (the mutex's loop) is where
// it runs unless it names an executor of its own.
template <class Handler>
class Completion {
 public:
  using executor_type = boost::asio::associated_executor_t<Handler, boost::asio::any_io_executor>;

  Completion(Handler handler, const boost::asio::any_io_executor& fallback)
      : work_(boost::asio::get_associated_executor(handler, fallback)), handler_(std::move(handler)) {}

  executor_type executor() const noexcept { return work_.get_executor(); }

  // The slot through which the handler's owner may cancel the operation.
  auto cancellation_slot() const noexcept { return boost::asio::get_associated_cancellation_slot(handler_); }

  // Once: queues the handler with `args` on its executor (never runs it
  // here: the caller may hold a lock, or be the initiating function). The
  // slot is cleared there, on the handler's side, where it is emitted from.
  template <class... Args>
  void complete(Args&&... args) {
    complete_after([] {}, std::forward<Args>(args)...);
  }
  // As complete, running `before` there first, just before the handler:
  // what the handler's side reads (a leadership's new value) is written on
  // its own executor.
  template <class Before, class... Args>
  void complete_after(Before before, Args&&... args) {
    executor_type ex = work_.get_executor();
    boost::asio::post(ex, [handler = std::move(handler_), work = std::move(work_), before = std::move(before),
                           ... args = std::forward<Args>(args)]() mutable {
      auto slot = boost::asio::get_associated_cancellation_slot(handler);
      if (slot.is_connected()) slot.clear();
      before();
      std::move(handler)(std::move(args)...);
    });
  }

 private:
  boost::asio::executor_work_guard<executor_type> work_;
  Handler handler_;
};

// The user's loop of a mutex (its AsioExecutor's executor): where an
// async_acquire's poll and timeout timers run and, by default, its handlers.
// Never its lease timer or heartbeat cadence: those are on the timer thread.
template <class State>
boost::asio::any_io_executor loop_of(const State& state) {
  return state.executor.get_executor();
}

}  // namespace pgmutex::asio_detail
