// The supervised command (child_process.hpp): forked, held at its gate, exec'd,
// signalled as a group, reaped.
#include "child_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include "exit_codes.hpp"
#include "process_group.hpp"
#include "signals.hpp"

extern char** environ;

namespace pgmutex::cli {
namespace {

// Our environment, minus the variables we override, plus the overrides; a
// late one as NAME= and room for its value, filled in the child.
std::vector<std::string> child_environment(const EnvironmentOverrides& overrides) {
  const auto overridden = [&](std::string_view text) {
    const auto named = [&](const std::string& name) {
      return text.size() > name.size() && text.starts_with(name) && text[name.size()] == '=';
    };
    for (const auto& [name, value] : overrides.variables)
      if (named(name)) return true;
    for (const auto& name : overrides.late)
      if (named(name)) return true;
    return false;
  };
  std::vector<std::string> entries;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry)
    if (const std::string_view text(*entry); !overridden(text)) entries.emplace_back(text);
  for (const auto& [name, value] : overrides.variables) entries.push_back(name + "=" + value);
  for (const auto& name : overrides.late) entries.push_back(name + "=" + std::string(late_value_room, '\0'));
  return entries;
}

std::vector<char*> as_argv(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (auto& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Where execvpe would find `name` first: the first folder of our PATH (or
// glibc's default, when PATH is unset) with an executable regular file of
// that name. Empty if none, or if the name has a slash (used as it is).
// Looked up while pgmutex waits for the lock: execvpe's own search tries an
// execve per folder until one works (ten failed ones on a machine whose PATH
// starts with tools' folders), between the grant and the command.
std::string found_on_path(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return {};
  const char* path = std::getenv("PATH");
  const std::string_view folders = path != nullptr ? path : "/bin:/usr/bin";
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = std::min(folders.find(':', start), folders.size());
    const std::string_view folder = folders.substr(start, end - start);
    // An empty entry is the current folder, as execvpe reads it.
    const std::string candidate = (folder.empty() ? std::string(".") : std::string(folder)) + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (end == folders.size()) return {};
    start = end + 1;
  }
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
  const std::string found = found_on_path(args.front());
  std::vector<std::string> env = child_environment(overrides);
  std::vector<char*> arg_pointers = as_argv(args);
  std::vector<char*> env_pointers = as_argv(env);
  // Where the child writes the late values: after NAME= of the last entries.
  late_count_ = overrides.late.size();
  std::vector<char*> late_slots;
  for (std::size_t i = 0; i < late_count_; ++i) {
    std::string& entry = env[env.size() - late_count_ + i];
    late_slots.push_back(entry.data() + overrides.late[i].size() + 1);
  }
  // What start() writes to the gate: a byte, then each late value in its room.
  std::vector<char> go(1 + late_count_ * late_value_room);
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
    // The whole message, or pgmutex ended before start(): it is written at
    // once (under PIPE_BUF), but may be read in parts.
    std::size_t got = 0;
    while (got < go.size()) {
      const ssize_t n = ::read(gate[0], go.data() + got, go.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) ::_exit(exit_code::internal);
      got += static_cast<std::size_t>(n);
    }
    for (std::size_t i = 0; i < late_count_; ++i)
      ::memcpy(late_slots[i], go.data() + 1 + i * late_value_room, late_value_room);
    // What reached us at the gate was for the waiting pgmutex, which acted on
    // it (from a terminal we share its group: a Ctrl-Z, a SIGUSR1 to the
    // group while it waited). Still pending here, each would reach the
    // command the moment it starts: none is the command's.
    sigset_t pending;
    if (::sigpending(&pending) == 0) {
      const timespec none{};
      while (::sigtimedwait(&pending, nullptr, &none) > 0) {
      }
    }
    // We block the supervised signals to read them; the command starts with
    // the mask we had before. Dispositions pass through exec untouched: a
    // signal ignored for us (nohup's SIGHUP) stays ignored, as a shell has it.
    ::sigprocmask(SIG_SETMASK, &original_signal_mask(), nullptr);
    // Where the search found it before the wait; if that no longer works,
    // the search again, with its own errors and its fallbacks (a script
    // without #! runs with sh).
    if (!found.empty()) ::execve(found.c_str(), arg_pointers.data(), env_pointers.data());
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

void ChildProcess::start(const std::vector<std::string>& late_values) {
  if (late_values.size() != late_count_)
    throw std::invalid_argument("the command needs " + std::to_string(late_count_) + " late environment values, not " +
                                std::to_string(late_values.size()));
  // Each value NUL-terminated in its room (the room was NULs already).
  std::vector<char> go(1 + late_count_ * late_value_room, '\0');
  go[0] = 1;
  for (std::size_t i = 0; i < late_values.size(); ++i) {
    const std::string& value = late_values[i];
    if (value.size() >= late_value_room || value.find('\0') != std::string::npos)
      throw std::invalid_argument("a late environment value has " + std::to_string(value.size()) +
                                  " bytes or a NUL: at most " + std::to_string(late_value_room - 1) + ", no NUL");
    std::copy(value.begin(), value.end(), go.begin() + 1 + static_cast<std::ptrdiff_t>(i * late_value_room));
  }
  if (go.size() > PIPE_BUF) throw std::invalid_argument("too many late environment values for one write to the gate");
  ssize_t n = 0;
  do n = ::write(gate_.get(), go.data(), go.size());
  while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(go.size()))
    throw std::system_error(errno, std::generic_category(), "write to the child's start gate");
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

bool ChildProcess::waiting_at_gate() noexcept {
  if (gate_.get() < 0 || exit_code_) return false;
  int status = 0;
  pid_t reaped = 0;
  do reaped = ::waitpid(pid_, &status, WNOHANG);
  while (reaped < 0 && errno == EINTR);
  if (reaped != pid_) return true;
  record_exit(status);
  return false;
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
