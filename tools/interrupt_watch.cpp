// Before the command starts, a thread that turns a supervised signal into a
// cancelled wait (interrupt_watch.hpp).
#include "interrupt_watch.hpp"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "exit_codes.hpp"

namespace pgmutex::cli {

InterruptWatch::InterruptWatch(SignalReader& signals, std::function<void(int)> before_exit)
    : signals_(signals), before_exit_(std::move(before_exit)), thread_([this](const std::stop_token& stop) { watch(stop); }) {}

InterruptWatch::~InterruptWatch() { finish(); }

int InterruptWatch::stop_at_grant() noexcept {
  if (!thread_.joinable()) return signal_.load();
  thread_.request_stop();
  wakeup_.notify();
  stopped_at_grant_ = true;
  seen_at_grant_ = signal_.load();
  return seen_at_grant_;
}

void InterruptWatch::finish() {
  if (!thread_.joinable()) return;
  thread_.request_stop();
  wakeup_.notify();
  thread_.join();
  if (!stopped_at_grant_ || seen_at_grant_ != 0) return;  // the caller acted on what it saw
  // Read by the thread after the grant (or as it came): raised again. The
  // supervised signals are blocked in every thread, so it waits for the reader.
  const int interrupt = signal_.load();
  const int late = late_.load();
  if (interrupt != 0) ::kill(::getpid(), interrupt);
  if (late != 0 && late != interrupt) ::kill(::getpid(), late);
}

void InterruptWatch::watch(const std::stop_token& stop) {
  while (!stop.stop_requested()) {
    pollfd fds[2] = {{signals_.fd(), POLLIN, 0}, {wakeup_.fd(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;  // EINTR
    while (auto info = signals_.next()) {
      const int signo = static_cast<int>(info->ssi_signo);
      if (stop.stop_requested()) {
        // The grant came: not ours to act on (finish() raises it again).
        int none = 0;
        late_.compare_exchange_strong(none, signo);
        continue;
      }
      const SignalRole role = role_of(signo);
      // No command runs yet: a job-control stop stops us, as it would any job.
      if (role == SignalRole::job_stop) ::kill(::getpid(), SIGSTOP);
      if (role != SignalRole::ending) continue;
      if (!waiting_.load()) {
        // Connecting: nothing to release, so stop now, as a shell's job would.
        const std::string line = std::string("pgmutex: interrupted by SIG") + signal_name(signo) + "\n";
        [[maybe_unused]] const auto n = ::write(STDERR_FILENO, line.data(), line.size());
        if (before_exit_) before_exit_(exit_code::signal_base + signo);
        std::_Exit(exit_code::signal_base + signo);
      }
      int none = 0;
      signal_.compare_exchange_strong(none, signo);
      cancel_.request_stop();
    }
  }
}

}  // namespace pgmutex::cli
