// Where an async operation's blocking part (the mutex's State logic and its
// statements) runs. By default on ThreadExecutor's I/O pool (run_off_loop).
// A backend that runs jobs on its own I/O thread (BackendRunsJobs, e.g.
// SessionBackend) gets it there instead: its statements are then sent at
// once, without a pool thread handing each one to that I/O thread and
// waiting (two thread hand-offs fewer per operation).
//
// The one hazard there: the state takes the mutex's I/O gate for each
// statement, and a thread of the user's may hold that gate while it waits for
// this very I/O thread to run its statement (a blocking call on the same
// mutex at the same time). So, on the I/O thread, just before the work would
// run, `io_busy()` (the gate is held) sends it to the pool instead. A thread may
// still take the gate between that check and the work's own entry: the I/O
// thread then waits for the gate while the gate's holder waits for the I/O
// thread, until the holder's statement gives up at its queueing deadline
// (its timeout) and leaves the gate. Narrow and bounded: never a hang.
#pragma once

#include <memory>
#include <utility>

#include "pgmutex/asio/completion.hpp"
#include "pgmutex/backend.hpp"

namespace pgmutex::asio_detail {

// One owner's share of a state, taken when the operation is initiated and
// given back when it is done: the state stays open if the user's guard goes
// meanwhile (a deferred heartbeat that is never launched gives it back too).
template <class State>
class Share {
 public:
  explicit Share(State* state) noexcept : state_(state) {
    if (state_ != nullptr) state_->add_owner();
  }
  Share(Share&& other) noexcept : state_(std::exchange(other.state_, nullptr)) {}
  Share& operator=(Share&&) = delete;
  ~Share() {
    if (state_ != nullptr) State::drop_owner(state_);
  }
  State* get() const noexcept { return state_; }

 private:
  State* state_;
};

// Work handed to a backend's thread, run there at most once. Destroyed
// unrun (the backend refused it, was stopped before its turn, or the gate
// was busy), it hands the work to the I/O pool from its destructor, so that
// the operation still completes (with the backend's error, if stopped).
template <class Fn>
class PoolFallback {
 public:
  explicit PoolFallback(Fn fn) : fn_(std::move(fn)) {}
  PoolFallback(const PoolFallback&) = delete;
  PoolFallback& operator=(const PoolFallback&) = delete;
  ~PoolFallback() {
    if (ran_) return;
    try {
      run_off_loop(std::move(fn_));
    } catch (...) {
      // No memory or thread for it: the operation is abandoned (its
      // handler destroyed uncalled), as a failed initiation would throw.
    }
  }
  void run() {
    ran_ = true;
    fn_();
  }

 private:
  Fn fn_;
  bool ran_ = false;
};

// Runs `fn` on `backend`'s thread if it can run jobs (and `backend` is not
// null), else on the I/O pool. `busy` is asked there, first: true sends `fn`
// to the pool. Whatever `busy` reads must be kept alive by `fn` (or by
// something `busy` locks).
template <class Backend, class Busy, class Fn>
void run_statements(Backend* backend, Busy busy, Fn fn) {
  if constexpr (BackendRunsJobs<Backend>) {
    if (backend != nullptr) {
      auto job = std::make_shared<PoolFallback<Fn>>(std::move(fn));
      (void)backend->run_job([job = std::move(job), busy = std::move(busy)] {
        if (!busy()) job->run();
      });
      return;
    }
  }
  run_off_loop(std::move(fn));
}

// The common case: `fn` owns a share of `state` until it runs.
template <class State, class Fn>
void run_statements_of(State* state, Fn fn) {
  run_statements(state != nullptr ? &state->io.backend : nullptr,
                 [state] { return state->io_busy(); }, std::move(fn));
}

}  // namespace pgmutex::asio_detail
