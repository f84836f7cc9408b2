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

// What the guard enforces of the lease once armed: the first deadline, and
// how long before it the command gets SIGTERM.
struct GuardedLease {
  std::chrono::steady_clock::time_point deadline;  // steady_clock is CLOCK_MONOTONIC
  std::chrono::nanoseconds lead{};                 // SIGTERM this long before the deadline
};

class Guardian {
 public:
  // Forks the guard, not yet armed: it has no target, and if pgmutex ends
  // before arm() it exits without killing anything. Forked while pgmutex
  // waits for the lock, the fork is not on the grant's path: between the
  // grant and the command's start there is one message. The guard leads its
  // own process group, not the command's nor pgmutex's, and blocks every
  // signal it can: only SIGKILL, or the end of pgmutex, ends it. Async-signal-
  // safe calls only in it: we have threads. `lock` and `grace` are what it
  // says and waits when it stops the command for the lease (--grace: SIGKILL
  // this long after its SIGTERM).
  Guardian(const std::string& lock, std::chrono::nanoseconds grace);
  // Without disarm(): an armed guard kills its target, as if pgmutex died.
  // A disarmed or never armed one exits on its own, and is reaped here.
  ~Guardian();

  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }

  // The guard's target from now on: a process group (-pgid) or a single pid,
  // as kill(2) takes it, and without `lease` it only watches for pgmutex's
  // end. Call it before the target may run (the command's gate): once it
  // returns, pgmutex's end kills the target, since a message queued on the
  // socket is read before its end of file. False if the guard is gone
  // (someone killed it while we waited): nothing guards the target then.
  [[nodiscard]] bool arm(pid_t target, const std::optional<GuardedLease>& lease) noexcept;

  // The lease now runs until `deadline`. Any thread; never blocks (a renewal
  // that finds the socket full is dropped: the guard then acts early, never late).
  void renew(std::chrono::steady_clock::time_point deadline) noexcept;

  // The socket the guard reports on (readable when it has stopped the
  // command for want of a renewal, or ended), for poll().
  [[nodiscard]] int report_fd() const noexcept { return socket_.get(); }
  // Reads what the guard reported, without blocking: true once it said it
  // stopped the command because the lease ran out unrenewed.
  [[nodiscard]] bool stopped_for_lease() noexcept;

  // Call once the target is gone: the guard kills nothing from now on, and
  // exits when our end of the socket closes (reap(), the destructor), or
  // after closing a socket handed over to it. Not waited for here: the
  // release need not wait for it.
  void disarm() noexcept;
  [[nodiscard]] bool disarmed() const noexcept { return disarmed_; }
  // Disarmed, with the release done and pgmutex about to exit: gives the
  // guard a copy of `socket` (the lock's connection, for
  // PostgresOptions::hand_over_at_close) to close `linger` from now, and lets
  // it go. It is not waited for: it outlives pgmutex by `linger` at most,
  // holding none of pgmutex's standard streams. False if it could not be
  // given (the guard is gone, was never disarmed, or its socket is full:
  // a stopped guard must not hold up our exit).
  bool hand_over(int socket, std::chrono::nanoseconds linger) noexcept;
  // Waits for a disarmed guard to exit (our end of the socket closed first),
  // unless it was reaped already, or handed a socket.
  void reap() noexcept;

  // The guard ended (someone killed it, or it was disarmed): reaped by our loop.
  void record_exit() noexcept { exited_ = true; }
  [[nodiscard]] bool exited() const noexcept { return exited_; }

 private:
  pid_t pid_ = -1;
  std::mutex socket_mutex_;  // renew() may come from the library's threads
  Fd socket_;  // our end; closing it without a word arms the kill
  bool armed_ = false;
  bool disarmed_ = false;
  bool handed_over_ = false;
  bool exited_ = false;
  bool stopped_for_lease_ = false;
};

}  // namespace pgmutex::cli
