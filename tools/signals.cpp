// Signals without handlers (signals.hpp): blocked in every thread, read from a
// signalfd.
#include "signals.hpp"

#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <system_error>
#include <utility>

namespace pgmutex::cli {
namespace {

sigset_t saved_mask;

[[noreturn]] void throw_errno(const char* what) { throw std::system_error(errno, std::generic_category(), what); }

bool ignored_at_start(int signo) {
  struct sigaction current {};
  return ::sigaction(signo, nullptr, &current) == 0 && current.sa_handler == SIG_IGN;
}

sigset_t catchable_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int signo = 1; signo < NSIG; ++signo) {
    if (signo == SIGKILL || signo == SIGSTOP) continue;
    // glibc's own real-time signals (thread cancellation, setxid) lie below
    // SIGRTMIN: blocking them would break glibc, and it refuses anyway.
    if (signo >= 32 && signo < SIGRTMIN) continue;
    if (signo != SIGCHLD && ignored_at_start(signo)) continue;
    sigaddset(&set, signo);
  }
  return set;
}

}  // namespace

const sigset_t& supervised_signals() {
  static const sigset_t set = catchable_signals();
  return set;
}

SignalRole role_of(int signo) noexcept {
  switch (signo) {
    case SIGCHLD: return SignalRole::child_exit;
    case SIGPIPE: return SignalRole::own;
    case SIGTSTP:
    case SIGTTIN:
    case SIGTTOU: return SignalRole::job_stop;
    case SIGCONT:
    case SIGWINCH:
    case SIGURG: return SignalRole::notice;
    default: return SignalRole::ending;
  }
}

void block_supervised_signals() {
  if (ignored_at_start(SIGCHLD)) ::signal(SIGCHLD, SIG_DFL);
  const sigset_t& set = supervised_signals();
  if (const int rc = pthread_sigmask(SIG_BLOCK, &set, &saved_mask); rc != 0)
    throw std::system_error(rc, std::generic_category(), "pthread_sigmask");
}

const sigset_t& original_signal_mask() { return saved_mask; }

Fd::Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

SignalReader::SignalReader() {
  fd_ = Fd(::signalfd(-1, &supervised_signals(), SFD_CLOEXEC | SFD_NONBLOCK));
  if (fd_.get() < 0) throw_errno("signalfd");
}

std::optional<signalfd_siginfo> SignalReader::next() {
  signalfd_siginfo info{};
  for (;;) {
    const ssize_t n = ::read(fd_.get(), &info, sizeof info);
    if (n == static_cast<ssize_t>(sizeof info)) return info;
    if (n < 0 && errno == EINTR) continue;
    return std::nullopt;  // EAGAIN: nothing pending
  }
}

Wakeup::Wakeup() {
  fd_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (fd_.get() < 0) throw_errno("eventfd");
}

void Wakeup::notify() const noexcept {
  const std::uint64_t one = 1;
  // Only EAGAIN (counter full) can fail here, and then a wakeup is pending anyway.
  [[maybe_unused]] const ssize_t n = ::write(fd_.get(), &one, sizeof one);
}

bool Wakeup::drain() const noexcept {
  std::uint64_t count = 0;
  return ::read(fd_.get(), &count, sizeof count) == static_cast<ssize_t>(sizeof count) && count > 0;
}

const char* signal_name(int signo) noexcept {
  const char* abbrev = ::sigabbrev_np(signo);
  return abbrev != nullptr ? abbrev : "?";
}

}  // namespace pgmutex::cli
