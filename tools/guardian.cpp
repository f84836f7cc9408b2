#include "guardian.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace pgmutex::cli {
namespace {

constexpr char disarm_byte = 'd';
constexpr int guard_fd = 3;

void say(const char* text) {
  std::size_t length = 0;
  while (text[length] != '\0') ++length;
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, text, length);
}

// The guard's whole life. Only async-signal-safe calls: it was forked from a
// process with threads, and never execs.
[[noreturn]] void guard(int read_end, int write_end, pid_t target) {
  sigset_t all;
  sigfillset(&all);
  // Signals for the command's group, or a terminal's Ctrl-C for ours, are not for us.
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  ::prctl(PR_SET_NAME, "pgmutex-guard", 0, 0, 0);
  // Keep stdin/out/err and the pipe, nothing else: a copy of the pipe's write
  // end would keep it open forever, one of pgmutex's sockets would keep its
  // connection open after pgmutex closed it.
  ::close(write_end);
  if (read_end != guard_fd) {
    ::dup2(read_end, guard_fd);
    ::close(read_end);
  }
  if (::close_range(guard_fd + 1, ~0U, 0) != 0)  // before Linux 5.9
    for (int fd = guard_fd + 1; fd < 1024; ++fd) ::close(fd);

  for (;;) {
    char byte = 0;
    const ssize_t n = ::read(guard_fd, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n == 1 && byte == disarm_byte) ::_exit(0);
    break;  // end of file (or a read error: fail safe): pgmutex is gone
  }
  if (::kill(target, SIGKILL) == 0)
    say(target < 0 ? "pgmutex-guard: pgmutex ended without stopping the command: killed its process group with SIGKILL\n"
                   : "pgmutex-guard: pgmutex ended without stopping the command: killed it with SIGKILL\n");
  ::_exit(0);
}

}  // namespace

Guardian::Guardian(pid_t target) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  pid_ = ::fork();
  if (pid_ < 0) {
    const int error = errno;
    ::close(ends[0]);
    ::close(ends[1]);
    throw std::system_error(error, std::generic_category(), "fork");
  }
  if (pid_ == 0) guard(ends[0], ends[1], target);
  ::close(ends[0]);
  pipe_ = Fd(ends[1]);
}

Guardian::~Guardian() {
  // Closing the pipe without a word is what pgmutex's death looks like to the
  // guard: on an error that ends pgmutex early, the command ends with it.
  pipe_ = Fd();
}

void Guardian::disarm() noexcept {
  if (pipe_.get() < 0) return;
  if (!exited_) {
    ssize_t n = 0;
    do n = ::write(pipe_.get(), &disarm_byte, 1);
    while (n < 0 && errno == EINTR);
  }
  pipe_ = Fd();
  if (exited_) return;
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exited_ = true;
}

}  // namespace pgmutex::cli
