// The wait loop while the command runs: signals forwarded, children reaped, the
// group stopped when it must be (supervisor.hpp).
#include "supervisor.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "process_group.hpp"

namespace pgmutex::cli {
namespace {

using steady = std::chrono::steady_clock;

constexpr steady::time_point no_deadline = steady::time_point::max();

// Processes of the group that are not our children end without a SIGCHLD to
// us: once only they remain, the group is looked at this often.
constexpr auto group_poll = std::chrono::milliseconds(50);

// A signal forwarded to the group reaches the command and its children at
// once, and the children may die a moment after the command: only what still
// runs this long after the command's exit is called a leftover.
constexpr auto leftover_settle = std::chrono::milliseconds(50);

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

class Supervision {
 public:
  Supervision(ChildProcess& child, Guardian& guardian, std::chrono::nanoseconds grace, const SupervisionEvents& events)
      : child_(child), guardian_(guardian), grace_(grace), events_(events) {}

  void reap() {
    reap_children([this](pid_t pid, int status) {
      if (pid == child_.pid()) {
        child_.record_exit(status);
        // From a terminal the guard's target is the command's own pid, which
        // is free for reuse once reaped: the guard must never kill it now.
        if (!child_.own_process_group()) guardian_.disarm();
      } else if (pid == guardian_.pid() && !guardian_.exited()) {
        guardian_.record_exit();
        // Disarmed, it was told to exit: only an early end is news.
        if (!guardian_.disarmed() && events_.guardian_died) events_.guardian_died();
      }
      // Anything else: an orphan of the command, reparented to us. Reaping it
      // is all there is to do: its zombie would keep the group alive.
    });
  }

  // SIGTERM to the group (unless the guard sent it), then SIGKILL once the grace is over.
  void stop_group(bool term_sent = false) {
    if (kill_deadline_ != no_deadline || result_.killed_after_grace) return;
    if (!term_sent) {
      child_.signal(SIGTERM);
      child_.signal(SIGCONT);  // a stopped process must wake up to die
    }
    kill_deadline_ = steady::now() + grace_;
  }

  void kill_if_due() {
    // Orphans that reach us after the SIGKILL (their parent just died of it) get theirs too.
    if (result_.killed_after_grace) child_.signal(SIGKILL);
    if (kill_deadline_ == no_deadline || steady::now() < kill_deadline_) return;
    kill_deadline_ = no_deadline;
    const auto stubborn = child_.remaining();
    child_.signal(SIGKILL);
    result_.killed_after_grace = true;
    if (!stubborn.empty() && events_.killed_after_grace) events_.killed_after_grace(stubborn);
  }

  void on_child_ended() {
    if (leftovers_seen_ || !child_.exit_code()) return;
    if (child_ended_at_ == no_deadline) child_ended_at_ = steady::now();
    if (steady::now() - child_ended_at_ < leftover_settle) return;  // the loop polls the group meanwhile
    leftovers_seen_ = true;
    if (result_.lease_lost) return;  // already being stopped
    const auto leftovers = child_.remaining();
    if (leftovers.empty()) return;
    if (events_.leftovers) events_.leftovers(leftovers);
    stop_group();
  }

  void on_signal(const signalfd_siginfo& info) {
    const int signo = static_cast<int>(info.ssi_signo);
    switch (role_of(signo)) {
      case SignalRole::child_exit:  // reaped at the top of the loop
      case SignalRole::own:         // our own write to a closed stderr
        return;
      case SignalRole::job_stop:
        if (!child_already_got(child_, info)) child_.signal(signo);
        // In a terminal's foreground group the command and we are one job:
        // stop with it so that the shell takes the terminal back. (Stopped,
        // we send no heartbeats: a stop longer than the lease loses the lock.)
        // Otherwise only the command stops, and we keep the lock alive.
        if (!child_.own_process_group()) ::kill(::getpid(), SIGSTOP);
        return;
      case SignalRole::notice:
      case SignalRole::ending:
        if (!child_already_got(child_, info)) child_.signal(signo);
        return;
    }
  }

  void on_lost() {
    if (result_.lease_lost) return;
    result_.lease_lost = true;
    if (events_.lease_lost) events_.lease_lost();
    stop_group();
  }

  // What the guard reported on its socket (never blocks). False once there is
  // nothing more to poll it for: it said its word, or it is gone.
  bool on_guard_report() {
    if (!guardian_.stopped_for_lease()) return !guardian_.exited() && guardian_.report_fd() >= 0;
    if (result_.guard_stopped) return false;
    result_.guard_stopped = true;
    const bool already_stopping = result_.lease_lost;
    result_.lease_lost = true;
    if (events_.guard_stopped) events_.guard_stopped();
    if (!already_stopping && !child_.all_gone()) stop_group(/*term_sent=*/true);
    return false;
  }

  int timeout_ms() const {
    int timeout = poll_timeout_ms(kill_deadline_);
    if (child_.exit_code()) {
      const int group = static_cast<int>(group_poll.count());
      timeout = timeout < 0 ? group : std::min(timeout, group);
    }
    return timeout;
  }

  SupervisionResult& result() { return result_; }

 private:
  ChildProcess& child_;
  Guardian& guardian_;
  std::chrono::nanoseconds grace_;
  const SupervisionEvents& events_;
  SupervisionResult result_;
  steady::time_point kill_deadline_ = no_deadline;
  steady::time_point child_ended_at_ = no_deadline;  // when we first saw it reaped
  bool leftovers_seen_ = false;
};

}  // namespace

SupervisionResult supervise(ChildProcess& child, Guardian& guardian, SignalReader& signals, const Wakeup& lost,
                            std::chrono::nanoseconds grace, const SupervisionEvents& events) {
  Supervision supervision(child, guardian, grace, events);
  bool watch_guard = true;
  for (;;) {
    supervision.reap();
    supervision.on_child_ended();
    supervision.kill_if_due();
    if (child.all_gone()) {
      supervision.reap();  // the zombies of what just died, so that none outlives us
      // The guard may have stopped the command while we were stopped: its
      // word waits on the socket, and says that the lease was lost.
      (void)supervision.on_guard_report();
      supervision.result().exit_code = *child.exit_code();
      return supervision.result();
    }

    // The guard's socket: until it has reported, or hung up (then reap() learns why).
    const int report_fd = watch_guard ? guardian.report_fd() : -1;
    pollfd fds[3] = {{signals.fd(), POLLIN, 0}, {lost.fd(), POLLIN, 0}, {report_fd, POLLIN, 0}};
    if (::poll(fds, 3, supervision.timeout_ms()) < 0 && errno != EINTR)
      throw std::system_error(errno, std::generic_category(), "poll");

    while (auto info = signals.next()) supervision.on_signal(*info);
    if (report_fd >= 0 && fds[2].revents != 0)
      watch_guard = supervision.on_guard_report() && (fds[2].revents & (POLLHUP | POLLERR)) == 0;
    if (lost.drain()) supervision.on_lost();
  }
}

}  // namespace pgmutex::cli
