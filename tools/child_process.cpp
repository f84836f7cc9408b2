// The supervised command (child_process.hpp): forked, held at its gate, exec'd,
// signalled as a group, reaped.
#include "child_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>
#include <system_error>

#include "exit_codes.hpp"
#include "process_group.hpp"
#include "signals.hpp"

extern char** environ;

namespace pgmutex::cli {
namespace {

// Our environment, minus the variables we override, plus the overrides.
std::vector<std::string> child_environment(const EnvironmentOverrides& overrides) {
  std::vector<std::string> entries;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    bool overridden = false;
    for (const auto& [name, value] : overrides.variables)
      overridden = overridden || (text.size() > name.size() && text.starts_with(name) && text[name.size()] == '=');
    if (!overridden) entries.emplace_back(text);
  }
  for (const auto& [name, value] : overrides.variables) entries.push_back(name + "=" + value);
  return entries;
}

std::vector<char*> as_argv(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (auto& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Reads the errno a failed exec wrote to `fd`; 0 if the exec succeeded (the
// pipe closed on exec without a word).
int exec_error(int fd) {
  int error = 0;
  ssize_t got = 0;
  do got = ::read(fd, &error, sizeof error);
  while (got < 0 && errno == EINTR);
  return got == static_cast<ssize_t>(sizeof error) ? error : 0;
}

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const EnvironmentOverrides& overrides,
                           bool own_process_group)
    : name_(argv.front()), own_group_(own_process_group) {
  std::vector<std::string> args = argv;
  std::vector<std::string> env = child_environment(overrides);
  std::vector<char*> arg_pointers = as_argv(args);
  std::vector<char*> env_pointers = as_argv(env);

  // fork + exec rather than posix_spawn, for the gate: the child must not run
  // the command before the guard that kills its group if pgmutex dies is in
  // place, and the guard needs the group's id, which only the fork gives. A
  // failed exec reports its errno through a close-on-exec pipe.
  int gate[2];
  int report[2];
  if (::pipe2(gate, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  if (::pipe2(report, O_CLOEXEC) != 0) {
    const int error = errno;
    ::close(gate[0]);
    ::close(gate[1]);
    throw std::system_error(error, std::generic_category(), "pipe2");
  }
  pid_ = ::fork();
  if (pid_ < 0) {
    const int error = errno;
    for (int fd : {gate[0], gate[1], report[0], report[1]}) ::close(fd);
    throw std::system_error(error, std::generic_category(), "fork");
  }
  if (pid_ == 0) {
    // The child: only async-signal-safe calls until exec.
    ::close(gate[1]);
    ::close(report[0]);
    if (own_group_) ::setpgid(0, 0);
    char go = 0;
    ssize_t got = 0;
    do got = ::read(gate[0], &go, 1);
    while (got < 0 && errno == EINTR);
    if (got != 1) ::_exit(exit_code::internal);  // pgmutex ended before start()
    // We block the supervised signals to read them; the command starts with
    // the mask we had before. Dispositions pass through exec untouched: a
    // signal ignored for us (nohup's SIGHUP) stays ignored, as a shell has it.
    ::sigprocmask(SIG_SETMASK, &original_signal_mask(), nullptr);
    ::execvpe(args.front().c_str(), arg_pointers.data(), env_pointers.data());
    const int error = errno;
    (void)!::write(report[1], &error, sizeof error);
    ::_exit(exit_code::not_found);
  }
  // Both sides set the group, so it exists whichever runs first.
  if (own_group_) ::setpgid(pid_, pid_);
  ::close(gate[0]);
  ::close(report[1]);
  gate_ = Fd(gate[1]);
  report_ = Fd(report[0]);
}

ChildProcess::~ChildProcess() {
  if (gate_.get() < 0 || exit_code_) return;
  gate_ = Fd();  // end of file at the gate: the child exits without exec
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

void ChildProcess::start() {
  const char go = 1;
  ssize_t n = 0;
  do n = ::write(gate_.get(), &go, 1);
  while (n < 0 && errno == EINTR);
  if (n != 1) throw std::system_error(errno, std::generic_category(), "write to the child's start gate");
  gate_ = Fd();
  const int error = exec_error(report_.get());
  report_ = Fd();
  if (error == 0) return;
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  record_exit(status);
  if (error == ENOENT || error == ENOTDIR) throw Exit(exit_code::not_found, name_ + ": command not found");
  throw Exit(exit_code::not_executable, name_ + ": cannot execute: " + ::strerror(error));
}

void ChildProcess::signal(int signo) const {
  if (pid_ <= 0) return;
  // The group's id stays taken while any member lives, zombies included, so
  // it cannot name a stranger's group until we have seen it empty. Likewise a
  // child's pid stays ours until we reap it, which this thread does.
  if (own_group_) {
    ::kill(-pid_, signo);
    return;
  }
  for (const pid_t pid : remaining()) ::kill(pid, signo);
}

std::vector<pid_t> ChildProcess::remaining() const {
  if (own_group_) return live_members(pid_).value_or(std::vector<pid_t>{});
  auto children = live_children(::getpid());
  if (!children) return exit_code_ ? std::vector<pid_t>{} : std::vector<pid_t>{pid_};  // no /proc: the child only
  std::erase(*children, guard_);
  return *children;
}

bool ChildProcess::all_gone() const {
  if (!exit_code_) return false;
  return own_group_ ? group_is_empty(pid_) : remaining().empty();
}

void ChildProcess::record_exit(int status) noexcept {
  if (WIFSIGNALED(status)) {
    killed_by_ = WTERMSIG(status);
    exit_code_ = exit_code::signal_base + WTERMSIG(status);
  } else {
    exit_code_ = WEXITSTATUS(status);
  }
}

bool in_terminal_foreground() noexcept {
  return ::isatty(STDIN_FILENO) == 1 && ::tcgetpgrp(STDIN_FILENO) == ::getpgrp();
}

}  // namespace pgmutex::cli
