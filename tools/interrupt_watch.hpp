// Before the command starts: a thread that reads the supervised signals so
// that one that would end a process (SIGINT, SIGTERM, SIGQUIT, SIGUSR1, ...)
// cancels the wait for the lock instead of being lost.
#pragma once

#include <atomic>
#include <functional>
#include <stop_token>
#include <thread>

#include "signals.hpp"

namespace pgmutex::cli {

class InterruptWatch {
 public:
  // While connecting nothing is held, so an interrupt ends the program at
  // once (exit 128 + N); once waiting for the lock, it cancels the wait.
  // `before_exit` runs, on the watching thread, just before such an exit, with its code.
  explicit InterruptWatch(SignalReader& signals, std::function<void(int exit_code)> before_exit = {});
  ~InterruptWatch();
  InterruptWatch(const InterruptWatch&) = delete;
  InterruptWatch& operator=(const InterruptWatch&) = delete;

  // From now on an interrupt requests stop on stop_token() instead of exiting.
  void start_waiting() noexcept { waiting_.store(true); }
  [[nodiscard]] std::stop_token stop_token() const noexcept { return cancel_.get_token(); }

  // At the grant: asks the thread to stop without waiting for it to wake up
  // (joining it there cost the handoff 0.5-1 ms), and returns the interrupt
  // that arrived so far, or 0. finish() joins it later.
  int stop_at_grant() noexcept;

  // Stops and joins the thread; afterwards the caller reads the signals.
  // After stop_at_grant() returned 0, a signal the thread read since (it
  // stops only once it wakes up) is not lost: it is sent to this process
  // again, for the reader that follows (the supervisor forwards it to the
  // command, as if it came just after the command's start).
  void finish();

  // The interrupt that arrived, or 0.
  [[nodiscard]] int interrupted_by() const noexcept { return signal_.load(); }

 private:
  void watch(const std::stop_token& stop);

  SignalReader& signals_;
  std::function<void(int)> before_exit_;
  Wakeup wakeup_;
  std::stop_source cancel_;
  std::atomic<bool> waiting_{false};
  std::atomic<int> signal_{0};
  std::atomic<int> late_{0};  // read after stop_at_grant(): for the next reader
  bool stopped_at_grant_ = false;
  int seen_at_grant_ = 0;
  std::jthread thread_;
};

}  // namespace pgmutex::cli
