// The guard process: if pgmutex dies in any way, even by SIGKILL, it kills the
// command's process group with SIGKILL.
//
// Why not PR_SET_PDEATHSIG on the command: the kernel clears it when a process
// changes its user or execs a set-user-ID program (setpriv, su, sudo), and it
// reaches one process, not its group. The guard is a process of its own that
// keeps pgmutex's user, never execs the command, and waits on a pipe whose
// only writer is pgmutex: end of file means pgmutex is gone.
#pragma once

#include <sys/types.h>

#include "signals.hpp"

namespace pgmutex::cli {

class Guardian {
 public:
  // Forks the guard for `target`: a process group (-pgid) or a single pid, as
  // kill(2) takes it. The guard stays in our process group, not the
  // command's, and blocks every signal it can: only SIGKILL, or the end of
  // pgmutex, stops it. Async-signal-safe calls only in it: we have threads.
  explicit Guardian(pid_t target);
  ~Guardian();  // without disarm(): the guard kills the target, as if pgmutex died

  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }

  // Call once the target is gone: the guard exits without killing, and is reaped.
  void disarm() noexcept;

  // The guard ended before disarm() (someone killed it): reaped by our loop.
  void record_exit() noexcept { exited_ = true; }
  [[nodiscard]] bool exited() const noexcept { return exited_; }

 private:
  pid_t pid_ = -1;
  Fd pipe_;  // the write end; closing it without a word arms the kill
  bool exited_ = false;
};

}  // namespace pgmutex::cli
