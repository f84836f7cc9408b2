// Signals without handlers: the supervised signals are blocked in every
// thread and read from a signalfd; other threads wake the main loop through
// an eventfd. Nothing here runs in signal context.
#pragma once

#include <signal.h>
#include <sys/signalfd.h>

#include <optional>

namespace pgmutex::cli {

// Every signal a process can catch, so that none can kill pgmutex and leave
// the lock's row held while the command runs on: all but SIGKILL, SIGSTOP,
// the two real-time signals glibc keeps for itself, and those that were
// ignored when pgmutex started (nohup's SIGHUP stays ignored, for the command
// too). SIGCHLD is always in it.
[[nodiscard]] const sigset_t& supervised_signals();

// What a supervised signal means to pgmutex.
enum class SignalRole {
  child_exit,  // SIGCHLD: a child of ours changed state
  own,         // SIGPIPE: our own write to a closed pipe (stderr), not the command's business
  job_stop,    // SIGTSTP, SIGTTIN, SIGTTOU: job control asks to stop
  notice,      // SIGCONT, SIGWINCH, SIGURG: by default they end no process
  ending,      // every other one: by default it ends the process that gets it
};
[[nodiscard]] SignalRole role_of(int signo) noexcept;

// Blocks the supervised signals in the calling thread; threads started later
// inherit the mask. Call before any thread exists. Resets an ignored SIGCHLD
// to its default: ignored, the kernel would reap our children before we could.
void block_supervised_signals();

// The signal mask and dispositions a child should start with: what ours were
// before block_supervised_signals().
[[nodiscard]] const sigset_t& original_signal_mask();

// A file descriptor that is closed on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept;
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  [[nodiscard]] int get() const noexcept { return fd_; }

 private:
  int fd_ = -1;
};

// Reads the supervised signals (which must be blocked) as data.
class SignalReader {
 public:
  SignalReader();
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  // The next pending signal, if any (never blocks).
  [[nodiscard]] std::optional<signalfd_siginfo> next();

 private:
  Fd fd_;
};

// A wakeup another thread can send; safe to call from any thread, any time.
class Wakeup {
 public:
  Wakeup();
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  void notify() const noexcept;
  // True if notify() was called since the last drain.
  bool drain() const noexcept;

 private:
  Fd fd_;
};

// The name of a signal without the SIG prefix, e.g. "TERM".
[[nodiscard]] const char* signal_name(int signo) noexcept;

}  // namespace pgmutex::cli
