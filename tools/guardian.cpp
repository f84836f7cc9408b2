// The guard process (guardian.hpp): it stops the command's process group when
// pgmutex can no longer be trusted to.
#include "guardian.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <system_error>

namespace pgmutex::cli {
namespace {

using std::chrono::nanoseconds;

// One message each way is one datagram of a SOCK_SEQPACKET pair: never split,
// never merged.
struct Message {
  char kind;
  std::int64_t value;    // renew, arm: the deadline, in nanoseconds of CLOCK_MONOTONIC (arm: no_time without a lease)
  std::int64_t lead_ns;  // arm: SIGTERM this long before the deadline
  std::int64_t target;   // arm: the kill(2) target
};
constexpr char arm_kind = 'a';            // pgmutex -> guard: the target, and the lease to enforce
constexpr char disarm_kind = 'd';         // pgmutex -> guard: nothing of the command runs any more
constexpr char hand_over_kind = 'h';      // pgmutex -> guard, disarmed: close the socket passed along `value` ns from now
constexpr char renew_kind = 'r';          // pgmutex -> guard: the lease runs until `value`
constexpr char stopped_kind = 's';        // guard -> pgmutex: no renewal came in time, SIGTERM went out
constexpr int guard_fd = 3;
constexpr std::int64_t no_time = INT64_MAX;

static_assert(std::chrono::steady_clock::is_steady);

std::int64_t monotonic_ns() noexcept {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

// libstdc++'s and libc++'s steady_clock read CLOCK_MONOTONIC: its time points
// are the guard's clock as they are.
std::int64_t to_monotonic_ns(std::chrono::steady_clock::time_point t) noexcept {
  return std::chrono::duration_cast<nanoseconds>(t.time_since_epoch()).count();
}

void say(const char* text) {
  std::size_t length = 0;
  while (text[length] != '\0') ++length;
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, text, length);
}

// `wait`: block while the socket is full (the guard always reads it soon).
// `passed` (unless -1): a descriptor sent along with it (SCM_RIGHTS).
bool send_message(int fd, char kind, std::int64_t value, bool wait = false, std::int64_t lead_ns = 0,
                  std::int64_t target = 0, int passed = -1) noexcept {
  Message message;
  std::memset(&message, 0, sizeof message);  // no stray padding bytes on the wire
  message.kind = kind;
  message.value = value;
  message.lead_ns = lead_ns;
  message.target = target;
  iovec data{&message, sizeof message};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr header{};
  header.msg_iov = &data;
  header.msg_iovlen = 1;
  if (passed >= 0) {
    header.msg_control = control;
    header.msg_controllen = sizeof control;
    cmsghdr* rights = CMSG_FIRSTHDR(&header);
    rights->cmsg_level = SOL_SOCKET;
    rights->cmsg_type = SCM_RIGHTS;
    rights->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(rights), &passed, sizeof passed);
  }
  ssize_t n = 0;
  do n = ::sendmsg(fd, &header, (wait ? 0 : MSG_DONTWAIT) | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(sizeof message);
}

// A message and, if one came along (SCM_RIGHTS), the descriptor passed with
// it (-1 if none). Returns recvmsg's count.
ssize_t receive_message(int fd, Message& message, int& passed, int flags = 0) noexcept {
  passed = -1;
  iovec data{&message, sizeof message};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr header{};
  header.msg_iov = &data;
  header.msg_iovlen = 1;
  header.msg_control = control;
  header.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(fd, &header, flags | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&header); c != nullptr; c = CMSG_NXTHDR(&header, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(sizeof(int)))
      std::memcpy(&passed, CMSG_DATA(c), sizeof passed);
  return n;
}

// Ends a connection handed over: our end of file first, then what the server
// still sends (a NOTIFY on a channel it listened to) is read until it closes
// its end, 1 s at most. Closed with bytes unread, the socket would send a
// reset, which the server logs ("could not receive data from client").
void close_draining(int socket) noexcept {
  ::shutdown(socket, SHUT_WR);
  const std::int64_t until = monotonic_ns() + 1'000'000'000;
  char sink[4096];
  for (;;) {
    const std::int64_t left = until - monotonic_ns();
    if (left <= 0) break;
    pollfd readable{socket, POLLIN, 0};
    const int ready = ::poll(&readable, 1, static_cast<int>((left + 999'999) / 1'000'000));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    const ssize_t n = ::read(socket, sink, sizeof sink);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server closed its end (or the connection broke)
  }
  ::close(socket);
}

// What the guard says and waits, fixed before the fork (it may not allocate).
struct GuardWords {
  std::int64_t grace_ns = 0;
  const char* group_line = "";    // said when it stops a process group for the lease
  const char* command_line = "";  // ... a single process (from a terminal)
};

int poll_timeout_ms(std::int64_t at, std::int64_t now) {
  if (at == no_time) return -1;
  if (at <= now) return 0;
  const std::int64_t ms = (at - now + 999'999) / 1'000'000;  // rounded up: never wake early
  return ms > 1'000'000 ? 1'000'000 : static_cast<int>(ms);
}

// The guard's whole life. Only async-signal-safe calls: it was forked from a
// process with threads, and never execs.
[[noreturn]] void guard(int own_end, int other_end, const GuardWords& words) {
  sigset_t all;
  sigfillset(&all);
  // Signals for the command's group, or a terminal's Ctrl-C for ours, are not
  // for us. (Blocked, SIGTTOU does not stop a write to the terminal either.)
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  // A group of our own: stopping pgmutex's group must not stop us (SIGSTOP
  // cannot be blocked). pgmutex does the same from its side.
  ::setpgid(0, 0);
  ::prctl(PR_SET_NAME, "pgmutex-guard", 0, 0, 0);
  // Keep stdin/out/err and our end of the socket, nothing else: a copy of
  // pgmutex's end would keep it open forever, one of pgmutex's sockets would
  // keep its connection open after pgmutex closed it.
  ::close(other_end);
  if (own_end != guard_fd) {
    ::dup2(own_end, guard_fd);
    ::close(own_end);
  }
  if (::close_range(guard_fd + 1, ~0U, 0) != 0)  // before Linux 5.9
    for (int fd = guard_fd + 1; fd < 1024; ++fd) ::close(fd);

  pid_t target = 0;  // 0: not armed yet (or disarmed), nothing to kill
  bool disarmed = false;
  std::int64_t lead_ns = 0;
  bool enforced = false;  // armed with a lease: renewals move the SIGTERM
  std::int64_t term_at = no_time;
  std::int64_t kill_at = no_time;
  bool stopping = false;  // SIGTERM went out: the lease is over for us
  for (;;) {
    const std::int64_t now = monotonic_ns();
    if (term_at != no_time && now >= term_at) {
      // No renewal in time: pgmutex is stopped or starved, and the command
      // must be gone by the deadline. The same escalation as pgmutex's.
      ::kill(target, SIGTERM);
      ::kill(target, SIGCONT);  // a stopped process must wake up to die
      say(target < 0 ? words.group_line : words.command_line);
      kill_at = term_at + words.grace_ns;
      term_at = no_time;
      stopping = true;
      (void)send_message(guard_fd, stopped_kind, 0);
    }
    if (kill_at != no_time && now >= kill_at) {
      ::kill(target, SIGKILL);
      kill_at = no_time;
    }

    pollfd fd{guard_fd, POLLIN, 0};
    const std::int64_t next = term_at < kill_at ? term_at : kill_at;
    const int ready = ::poll(&fd, 1, poll_timeout_ms(next, now));
    if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
    if (ready < 0) break;  // fail safe
    Message message;
    int passed = -1;
    const ssize_t n = receive_message(guard_fd, message, passed);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    const bool whole = n == static_cast<ssize_t>(sizeof message);
    if (whole && message.kind == hand_over_kind && disarmed && passed >= 0) {
      // pgmutex is about to exit: the server session of its connection ends
      // when this copy closes, after the next holder's start. pgmutex's
      // standard streams go first: whoever reads its output (a $(...), a
      // pipe) must not wait for us.
      ::close(STDIN_FILENO);
      ::close(STDOUT_FILENO);
      ::close(STDERR_FILENO);
      timespec linger{static_cast<time_t>(message.value / 1'000'000'000), static_cast<long>(message.value % 1'000'000'000)};
      while (::clock_nanosleep(CLOCK_MONOTONIC, 0, &linger, &linger) == EINTR) {
      }
      close_draining(passed);
      ::_exit(0);
    }
    if (passed >= 0) ::close(passed);  // passed along with anything else: not ours to keep
    if (whole && message.kind == disarm_kind) {
      // Nothing to kill from now on; we exit when pgmutex closes its end,
      // or once the socket it may hand over is closed.
      target = 0;
      disarmed = true;
      enforced = false;
      term_at = kill_at = no_time;
      continue;
    }
    if (whole && message.kind == arm_kind && target == 0 && !disarmed && message.target != 0) {
      target = static_cast<pid_t>(message.target);
      lead_ns = message.lead_ns;
      enforced = message.value != no_time;
      if (enforced) term_at = message.value - lead_ns;
      continue;
    }
    if (whole && message.kind == renew_kind) {
      // Once SIGTERM went out the lease is over for us: a late renewal changes nothing.
      if (enforced && !stopping) term_at = message.value - lead_ns;
      continue;
    }
    break;  // end of file (or a read error, or garbage: fail safe): pgmutex is gone
  }
  if (target != 0 && ::kill(target, SIGKILL) == 0)
    say(target < 0 ? "pgmutex-guard: pgmutex ended without stopping the command: killed its process group with SIGKILL\n"
                   : "pgmutex-guard: pgmutex ended without stopping the command: killed it with SIGKILL\n");
  ::_exit(0);
}

}  // namespace

Guardian::Guardian(const std::string& lock, std::chrono::nanoseconds grace) {
  // Everything the guard needs is made before the fork: it may not allocate.
  char grace_text[32];
  std::snprintf(grace_text, sizeof grace_text, "%.1f s", std::chrono::duration<double>(grace).count());
  const auto line = [&](const char* what) {
    return "pgmutex-guard: no lease renewal from pgmutex for lock '" + lock + "' (pgmutex is stopped or starved): " +
           what + " gets SIGTERM now, SIGKILL after " + grace_text + "\n";
  };
  const std::string group_line = line("its command's process group");
  const std::string command_line = line("its command");
  const GuardWords words{.grace_ns = grace.count(), .group_line = group_line.c_str(), .command_line = command_line.c_str()};
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) != 0)
    throw std::system_error(errno, std::generic_category(), "socketpair");
  pid_ = ::fork();
  if (pid_ < 0) {
    const int error = errno;
    ::close(ends[0]);
    ::close(ends[1]);
    throw std::system_error(error, std::generic_category(), "fork");
  }
  if (pid_ == 0) guard(ends[0], ends[1], words);
  // Also from here, so that no stop of our group can come before the guard's own setpgid.
  (void)::setpgid(pid_, pid_);
  ::close(ends[0]);
  socket_ = Fd(ends[1]);
}

bool Guardian::arm(pid_t target, const std::optional<GuardedLease>& lease) noexcept {
  const std::lock_guard lock(socket_mutex_);
  if (socket_.get() < 0 || exited_ || armed_ || target == 0) return false;
  // Blocking: the socket is empty, the guard has never been sent anything.
  armed_ = send_message(socket_.get(), arm_kind, lease ? to_monotonic_ns(lease->deadline) : no_time, /*wait=*/true,
                        lease ? lease->lead.count() : 0, target);
  return armed_;
}

Guardian::~Guardian() {
  {
    // Closing the socket without a word is what pgmutex's death looks like to
    // the guard: on an error that ends pgmutex early, the command ends with it.
    const std::lock_guard lock(socket_mutex_);
    socket_ = Fd();
  }
  // Not armed (the lock was not granted) or disarmed: it exits at once,
  // unless it was handed a socket to close later (not waited for).
  if ((!armed_ || disarmed_) && !handed_over_) {
    disarmed_ = true;
    reap();
  }
}

void Guardian::renew(std::chrono::steady_clock::time_point deadline) noexcept {
  const std::lock_guard lock(socket_mutex_);
  if (socket_.get() < 0 || exited_) return;
  (void)send_message(socket_.get(), renew_kind, to_monotonic_ns(deadline));
}

bool Guardian::stopped_for_lease() noexcept {
  const std::lock_guard lock(socket_mutex_);
  while (socket_.get() >= 0) {
    Message message;
    int passed = -1;
    const ssize_t n = receive_message(socket_.get(), message, passed, MSG_DONTWAIT);
    if (passed >= 0) ::close(passed);  // the guard passes none: never keep one
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof message)) break;  // nothing more (or the guard is gone)
    if (message.kind == stopped_kind) stopped_for_lease_ = true;
  }
  return stopped_for_lease_;
}

void Guardian::disarm() noexcept {
  const std::lock_guard lock(socket_mutex_);
  if (socket_.get() < 0 || disarmed_) return;
  if (!exited_) (void)send_message(socket_.get(), disarm_kind, 0, /*wait=*/true);
  disarmed_ = true;
  // What the guard said last is still worth knowing.
  Message message;
  while (::recv(socket_.get(), &message, sizeof message, MSG_DONTWAIT) == static_cast<ssize_t>(sizeof message))
    if (message.kind == stopped_kind) stopped_for_lease_ = true;
}

bool Guardian::hand_over(int socket, std::chrono::nanoseconds linger) noexcept {
  const std::lock_guard lock(socket_mutex_);
  if (socket_.get() < 0 || !disarmed_ || exited_ || handed_over_ || socket < 0) return false;
  // Not waiting: a guard that does not read (stopped) must not hold up
  // pgmutex's exit; the connection then ends here, as libpq ends it.
  if (!send_message(socket_.get(), hand_over_kind, linger.count(), /*wait=*/false, 0, 0, socket)) return false;
  handed_over_ = true;
  socket_ = Fd();  // the guard reads the message, then our end of file
  return true;
}

void Guardian::reap() noexcept {
  if (exited_ || !disarmed_ || handed_over_ || pid_ <= 0) return;
  {
    const std::lock_guard lock(socket_mutex_);
    socket_ = Fd();  // a disarmed guard exits at our end of file
  }
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exited_ = true;
}

}  // namespace pgmutex::cli
