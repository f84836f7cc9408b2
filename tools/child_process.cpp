#include "child_process.hpp"

#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>
#include <system_error>

#include "exit_codes.hpp"
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

// posix_spawn's attribute objects, destroyed on every path.
struct SpawnAttributes {
  posix_spawnattr_t attr{};
  SpawnAttributes() { posix_spawnattr_init(&attr); }
  ~SpawnAttributes() { posix_spawnattr_destroy(&attr); }
  SpawnAttributes(const SpawnAttributes&) = delete;
  SpawnAttributes& operator=(const SpawnAttributes&) = delete;
};

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const EnvironmentOverrides& overrides,
                           bool own_process_group)
    : own_group_(own_process_group) {
  std::vector<std::string> args = argv;
  std::vector<std::string> env = child_environment(overrides);
  std::vector<char*> arg_pointers = as_argv(args);
  std::vector<char*> env_pointers = as_argv(env);

  SpawnAttributes spawn;
  // We block the supervised signals to read them; the child starts with the
  // mask we had before. Dispositions pass through exec untouched: a signal
  // ignored for us (nohup's SIGHUP) stays ignored for the command, as a shell
  // would have it.
  short flags = POSIX_SPAWN_SETSIGMASK;
  posix_spawnattr_setsigmask(&spawn.attr, &original_signal_mask());
  if (own_group_) {
    flags |= POSIX_SPAWN_SETPGROUP;
    posix_spawnattr_setpgroup(&spawn.attr, 0);
  }
  posix_spawnattr_setflags(&spawn.attr, flags);

  const int rc = ::posix_spawnp(&pid_, args.front().c_str(), nullptr, &spawn.attr, arg_pointers.data(),
                                env_pointers.data());
  if (rc == ENOENT || rc == ENOTDIR)
    throw Exit(exit_code::not_found, args.front() + ": command not found");
  if (rc != 0)
    throw Exit(exit_code::not_executable, args.front() + ": cannot execute: " + ::strerror(rc));
}

void ChildProcess::signal(int signo) const noexcept {
  if (exit_code_ || pid_ <= 0) return;
  ::kill(own_group_ ? -pid_ : pid_, signo);
}

std::optional<int> ChildProcess::try_reap() {
  if (exit_code_) return exit_code_;
  int status = 0;
  pid_t reaped = 0;
  do reaped = ::waitpid(pid_, &status, WNOHANG);
  while (reaped < 0 && errno == EINTR);
  if (reaped == 0) return std::nullopt;
  if (reaped < 0) throw std::system_error(errno, std::generic_category(), "waitpid");
  if (WIFSIGNALED(status)) {
    killed_by_ = WTERMSIG(status);
    exit_code_ = exit_code::signal_base + WTERMSIG(status);
  } else {
    exit_code_ = WEXITSTATUS(status);
  }
  return exit_code_;
}

bool in_terminal_foreground() noexcept {
  return ::isatty(STDIN_FILENO) == 1 && ::tcgetpgrp(STDIN_FILENO) == ::getpgrp();
}

}  // namespace pgmutex::cli
