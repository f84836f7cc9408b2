#include "supervisor.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

namespace pgmutex::cli {
namespace {

using steady = std::chrono::steady_clock;

constexpr steady::time_point no_deadline = steady::time_point::max();

// poll()'s timeout for a deadline: -1 without one, rounded up so we never wake early.
int poll_timeout_ms(steady::time_point deadline) {
  if (deadline == no_deadline) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<long long>(left.count(), 1'000'000));
}

// A signal a terminal sent to its foreground group already reached a child in
// that group: forwarding it would deliver it twice.
bool child_already_got(const ChildProcess& child, const signalfd_siginfo& info) {
  return !child.own_process_group() && info.ssi_code == SI_KERNEL;
}

}  // namespace

SupervisionResult supervise(ChildProcess& child, SignalReader& signals, const Wakeup& lost,
                            std::chrono::nanoseconds grace, const std::function<void()>& on_lost) {
  SupervisionResult result;
  steady::time_point kill_deadline = no_deadline;
  for (;;) {
    if (auto code = child.try_reap()) {
      result.exit_code = *code;
      return result;
    }
    if (kill_deadline != no_deadline && steady::now() >= kill_deadline) {
      child.signal(SIGKILL);
      result.killed_after_grace = true;
      kill_deadline = no_deadline;  // now only its exit is awaited
    }

    pollfd fds[2] = {{signals.fd(), POLLIN, 0}, {lost.fd(), POLLIN, 0}};
    if (::poll(fds, 2, poll_timeout_ms(kill_deadline)) < 0 && errno != EINTR)
      throw std::system_error(errno, std::generic_category(), "poll");

    while (auto info = signals.next()) {
      const int signo = static_cast<int>(info->ssi_signo);
      const SignalRole role = role_of(signo);
      // SIGCHLD: reaped at the top of the loop. SIGPIPE: our own write to a closed stderr.
      if (role == SignalRole::child_exit || role == SignalRole::own) continue;
      if (!child_already_got(child, *info)) child.signal(signo);
      // In a terminal's foreground group the command and we are one job:
      // stop with it so that the shell takes the terminal back. (Stopped, we
      // send no heartbeats: a stop longer than the lease loses the lock.)
      // Otherwise only the command stops, and we keep the lock alive.
      if (role == SignalRole::job_stop && !child.own_process_group()) ::kill(::getpid(), SIGSTOP);
    }
    if (lost.drain() && !result.lease_lost) {
      result.lease_lost = true;
      on_lost();
      child.signal(SIGTERM);
      child.signal(SIGCONT);  // a stopped command must wake up to die
      kill_deadline = steady::now() + grace;
    }
  }
}

}  // namespace pgmutex::cli
