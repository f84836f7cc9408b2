// The supervised command: forked, held at a gate until pgmutex has armed what
// must be in place before it runs, then exec'd; signalled as a group; reaped.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "signals.hpp"

namespace pgmutex::cli {

// NAME=value entries to set in the child's environment, on top of ours.
struct EnvironmentOverrides {
  std::vector<std::pair<std::string, std::string>> variables;
  // Names whose values are known only once the lock is granted (the fence):
  // their room is reserved before the fork, and start() fills it.
  std::vector<std::string> late;
};

// The room of a late value, its NUL included: an instance id has at most 64
// characters of up to 4 bytes, a fence at most 20 digits.
inline constexpr std::size_t late_value_room = 512;

class ChildProcess {
 public:
  // Forks the child for `argv` (looked up in PATH) with our environment plus
  // `overrides`, the signal mask and dispositions we started with. It waits
  // before exec until start(); if pgmutex dies first, it exits unexec'd.
  //
  // own_process_group: the child leads a new process group and every signal
  // we send goes to the whole group, so a shell script's own children stop
  // too. Not done when we run in a terminal's foreground, where the child must
  // stay in the terminal's foreground group to read from it (and receives the
  // terminal's Ctrl-C itself). There the command's processes are the child
  // and our other children (as a subreaper, we inherit what it orphans),
  // signalled one by one; what the child's live descendants do is theirs.
  ChildProcess(const std::vector<std::string>& argv, const EnvironmentOverrides& overrides, bool own_process_group);
  ~ChildProcess();  // a child never started exits at once and is reaped

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Lets the child exec, with `late_values` (one per name of overrides.late,
  // in order) in its environment. Throws Exit: 127 if the command is not
  // found, 126 if it cannot be executed (the child is reaped then);
  // std::invalid_argument for late values that do not fit.
  void start(const std::vector<std::string>& late_values = {});
  // True while the child waits at its gate: not started, not ended. One that
  // ended there (someone killed it while pgmutex waited for the lock) is
  // reaped here, and false.
  [[nodiscard]] bool waiting_at_gate() noexcept;

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] bool own_process_group() const noexcept { return own_group_; }
  // What kill(2) takes to reach the command: its group (-pgid), or its pid.
  [[nodiscard]] pid_t kill_target() const noexcept { return own_group_ ? -pid_ : pid_; }

  // Without an own group: our child `pid` that is not the command's (the guard).
  void set_guard(pid_t pid) noexcept { guard_ = pid; }

  // Sends `signo` to the group while any process of it runs, even after the
  // child itself ended; without an own group, to each of remaining().
  void signal(int signo) const;

  // The live processes of the command's group; without an own group, our
  // live children but the guard: the child, and what it orphaned.
  [[nodiscard]] std::vector<pid_t> remaining() const;
  // True once the child is reaped and remaining() is empty.
  [[nodiscard]] bool all_gone() const;

  // The wait status of our child, from whoever reaped it.
  void record_exit(int wait_status) noexcept;

  // The exit code a shell would report (status, or 128 + signal) once the
  // child has been reaped; nullopt while it runs.
  [[nodiscard]] std::optional<int> exit_code() const noexcept { return exit_code_; }
  // The signal that killed it, if one did.
  [[nodiscard]] std::optional<int> killed_by() const noexcept { return killed_by_; }

 private:
  std::string name_;
  pid_t pid_ = -1;
  bool own_group_ = false;
  pid_t guard_ = -1;
  std::size_t late_count_ = 0;
  Fd gate_;    // the write end of the pipe the child waits on before exec
  Fd report_;  // the read end of the pipe a failed exec writes its errno to
  std::optional<int> exit_code_;
  std::optional<int> killed_by_;
};

// True when stdin is a terminal whose foreground process group is ours.
[[nodiscard]] bool in_terminal_foreground() noexcept;

}  // namespace pgmutex::cli
