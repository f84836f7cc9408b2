// One libpq connection driven through its non-blocking API, so that every
// call ends by a deadline, whatever the peer does: a frozen server (TCP open,
// nothing answered, the kernel still ACKing) fails the call on time instead of
// blocking it, which libpqxx 6's blocking calls cannot do. Private to the backend.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "statement_outcome.hpp"

struct pg_conn;

namespace pgmutex::postgres_detail {

using Deadline = std::chrono::steady_clock::time_point;

// One NOTIFY as it arrived: its channel and its payload (empty if none).
struct Notification {
  std::string channel;
  std::string payload;
};

class PqConnection;

// A connection being opened: PQconnectStart, then PQconnectPoll each time
// its socket is ready. Unlike PqConnection::open it outlives a caller's
// deadline: polled again later, it goes on where it stopped. A server slow
// to start a backend (a loaded machine, every client reconnecting at once)
// is then not asked for a new one by each caller that gave up waiting: a
// backend whose client left mid-start-up is work thrown away, and enough of
// them keep everyone from connecting.
class PqConnecting {
 public:
  static Outcome<PqConnecting> start(const std::string& conninfo);

  PqConnecting(PqConnecting&& other) noexcept;
  PqConnecting& operator=(PqConnecting&& other) noexcept;
  PqConnecting(const PqConnecting&) = delete;
  PqConnecting& operator=(const PqConnecting&) = delete;
  ~PqConnecting();

  // Polls until the connection is made (returned; this object is then
  // spent), fails (the failure; spent too) or `deadline` passes
  // (Kind::timeout; still pending: it may be polled again).
  Outcome<PqConnection> poll_until(Deadline deadline);
  [[nodiscard]] bool pending() const noexcept { return connecting_ != nullptr; }

 private:
  explicit PqConnecting(pg_conn* connecting) noexcept : connecting_(connecting) {}
  Outcome<PqConnection> fail(StatementFailure failure);

  pg_conn* connecting_ = nullptr;
  bool wants_read_ = false;  // PQconnectPoll's last answer: reading (else writing, as libpq starts)
};

class PqConnection {
 public:
  // Connects with PQconnectStart/PQconnectPoll; fails with Kind::timeout at `deadline`.
  static Outcome<PqConnection> open(const std::string& conninfo, Deadline deadline);

  PqConnection(PqConnection&& other) noexcept;
  PqConnection& operator=(PqConnection&& other) noexcept;
  PqConnection(const PqConnection&) = delete;
  PqConnection& operator=(const PqConnection&) = delete;
  ~PqConnection();

  // False once the connection broke or a call timed out: drop it and open another.
  [[nodiscard]] bool usable() const noexcept;

  // Closes the connection without ending its server session, if
  // `hand_over` took a copy of its socket (PostgresOptions::hand_over_at_close):
  // only a usable, idle, unencrypted connection is offered. True if it was
  // handed over and closed (this object is then spent); false: nothing changed.
  bool close_handing_over(const std::function<bool(int socket)>& hand_over) noexcept;

  Outcome<Rows> prepare(const std::string& name, const std::string& sql, Deadline deadline);
  Outcome<Rows> exec_prepared(const std::string& name, const std::vector<std::string>& params, Deadline deadline);
  // One statement with parameters (extended protocol, unnamed).
  Outcome<Rows> exec_params(const std::string& sql, const std::vector<std::string>& params, Deadline deadline);
  // Two statements with parameters, unnamed, in one round trip and one
  // transaction (libpq's pipeline mode): `setup` (say, a set_config(...,
  // true)) is in force when `sql` starts. The rows are `sql`'s.
  Outcome<Rows> exec_params_after(const std::string& setup, const std::vector<std::string>& setup_params,
                                  const std::string& sql, const std::vector<std::string>& params, Deadline deadline);
  // A parameterless string, possibly several statements (one implicit transaction).
  Outcome<Rows> exec_simple(const std::string& sql, Deadline deadline);

  // Waits for a NOTIFY on `channel` sent by another session: true if one came
  // (or had already come) before `deadline`, false if not.
  Outcome<bool> wait_for_notification(std::string_view channel, Deadline deadline);
  // Forgets notifications that already arrived on `channel`.
  void discard_notifications(std::string_view channel);

  // For a caller that waits on the socket itself with poll() (pgmutex::Session,
  // whose I/O thread also waits for new work and timers): the socket (-1 if
  // none), reading what arrived without blocking (false: the connection is
  // gone), and the channels notified so far, taken out.
  [[nodiscard]] int socket() const noexcept;
  bool consume_input();
  std::vector<Notification> take_notifications();
  // The payloads of the NOTIFYs on `channel` that arrived so far, taken out
  // (a queued waiter reads whom a release offered the lock).
  std::vector<std::string> take_payloads(std::string_view channel);
  // Blocks until the socket has input (read at once: true), `wake_fd`
  // (-1: none) is readable or `deadline` passes (false), making no
  // statement; an error: the connection is gone.
  enum class Woke : unsigned char { input, wake_fd, deadline };
  Outcome<Woke> await_input(Deadline deadline, int wake_fd);

  // The server process id the connection's start-up reported (a pooler
  // reports a key of its own), and the one to ignore NOTIFYs from (our own
  // releases): by default the same, set to pg_backend_pid() once asked.
  [[nodiscard]] int reported_backend_pid() const noexcept;
  void set_backend_pid(int pid) noexcept { backend_pid_ = pid; }
  // The role the connection logged in as.
  [[nodiscard]] std::string user() const;

 private:
  friend class PqConnecting;
  explicit PqConnection(pg_conn* connection) noexcept;
  // Sends, flushes within the deadline, then reads with `read`.
  template <class Send, class Read>
  Outcome<Rows> run(Send&& send, Read&& read, Deadline deadline);
  template <class Send>
  Outcome<Rows> run(Send&& send, Deadline deadline);
  Outcome<Rows> read_results(Deadline deadline);
  // The results of a pipeline of two queries and a sync: the second's rows.
  Outcome<Rows> read_pipeline(Deadline deadline);
  // Waits until a result can be taken without blocking; false: the connection is gone or timed out (`failure` set).
  bool await_result(Deadline deadline, std::optional<StatementFailure>& failure);
  void collect_notifications();
  // Gives up on the connection: a cancel is attempted in the background, and it is closed.
  void abandon() noexcept;
  StatementFailure broken(std::string_view during, bool sent);

  pg_conn* connection_ = nullptr;
  int backend_pid_ = 0;
  // NOTIFYs from other sessions, read along with any result; a bounded backlog.
  std::deque<Notification> notified_;
};

}  // namespace pgmutex::postgres_detail
