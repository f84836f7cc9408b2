// The guard process: it stops the command's process group when pgmutex can
// no longer be trusted to.
//
//   - pgmutex dies in any way, even by SIGKILL: the guard kills the group
//     with SIGKILL at once.
//   - pgmutex stops renewing the lease (stopped with SIGSTOP, or not
//     scheduled): pgmutex sends the guard each renewed lease deadline on the
//     monotonic clock (CLOCK_MONOTONIC, one clock for every process of the
//     machine). If no renewal has come `lead` before the deadline, the guard
//     sends the group SIGTERM (and SIGCONT), SIGKILL `grace` later, as pgmutex
//     does after a lost lease, and tells pgmutex so.
//
// Why not PR_SET_PDEATHSIG on the command: the kernel clears it when a process
// changes its user or execs a set-user-ID program (setpriv, su, sudo), and it
// reaches one process, not its group. The guard is a process of its own that
// keeps pgmutex's user, never execs the command, and talks with pgmutex over a
// socket pair whose other end only pgmutex holds: end of file means pgmutex
// is gone. It leads a process group of its own, so stopping pgmutex's group
// (Ctrl-Z, kill -STOP -PGID) never stops the guard.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>

#include "signals.hpp"

namespace pgmutex::cli {

// What the guard enforces of the lease: the first deadline, and how it stops
// the command once a deadline passes unrenewed.
struct GuardedLease {
  std::chrono::steady_clock::time_point deadline;  // steady_clock is CLOCK_MONOTONIC
  std::chrono::nanoseconds lead{};                 // SIGTERM this long before the deadline
  std::chrono::nanoseconds grace{};                // SIGKILL this long after the SIGTERM
  std::string lock;                                // for the guard's one line on stderr
};

class Guardian {
 public:
  // Forks the guard for `target`: a process group (-pgid) or a single pid, as
  // kill(2) takes it. The guard leads its own process group, not the
  // command's nor pgmutex's, and blocks every signal it can: only SIGKILL, or
  // the end of pgmutex, ends it. Async-signal-safe calls only in it: we have
  // threads. Without `lease`, the guard only watches for pgmutex's end.
  explicit Guardian(pid_t target, const std::optional<GuardedLease>& lease = std::nullopt);
  ~Guardian();  // without disarm(): the guard kills the target, as if pgmutex died

  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }

  // The lease now runs until `deadline`. Any thread; never blocks (a renewal
  // that finds the socket full is dropped: the guard then acts early, never late).
  void renew(std::chrono::steady_clock::time_point deadline) noexcept;

  // The socket the guard reports on (readable when it has stopped the
  // command for want of a renewal, or ended), for poll().
  [[nodiscard]] int report_fd() const noexcept { return socket_.get(); }
  // Reads what the guard reported, without blocking: true once it said it
  // stopped the command because the lease ran out unrenewed.
  [[nodiscard]] bool stopped_for_lease() noexcept;

  // Call once the target is gone: the guard exits without killing, and is reaped.
  void disarm() noexcept;

  // The guard ended before disarm() (someone killed it): reaped by our loop.
  void record_exit() noexcept { exited_ = true; }
  [[nodiscard]] bool exited() const noexcept { return exited_; }

 private:
  pid_t pid_ = -1;
  std::mutex socket_mutex_;  // renew() may come from the library's threads
  Fd socket_;  // our end; closing it without a word arms the kill
  bool exited_ = false;
  bool stopped_for_lease_ = false;
};

}  // namespace pgmutex::cli
