// PqConnection (pq_connection.hpp): libpq's non-blocking calls, each waited
// on with poll() until its deadline.
#include "pq_connection.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <utility>

#include <libpq-fe.h>

#include "pq_cancel.hpp"
#include "pq_results.hpp"

namespace pgmutex::postgres_detail {
namespace {

constexpr std::size_t max_pending_notifications = 1024;

enum class Ready { yes, timed_out, failed };

// Waits until `socket` is ready for `events` or the deadline passes. Rounds
// the wait up to whole milliseconds so a wait never ends just short of it.
Ready wait_socket(int socket, short events, Deadline deadline) {
  if (socket < 0) return Ready::failed;
  for (;;) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) return Ready::timed_out;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    pollfd p{socket, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(ms, 1 << 30)));
    if (n > 0) return Ready::yes;
    if (n == 0) continue;  // re-check the clock: poll may wake a little early
    if (errno != EINTR) return Ready::failed;
  }
}

void ignore_notice(void*, const char*) {}

StatementFailure timed_out(std::string_view during, bool sent) {
  return StatementFailure{StatementFailure::Kind::timeout, {}, "timed out " + std::string(during), sent};
}


}  // namespace

PqConnection::PqConnection(pg_conn* connection) noexcept
    : connection_(connection), backend_pid_(PQbackendPID(connection)) {}

PqConnection::PqConnection(PqConnection&& other) noexcept
    : connection_(std::exchange(other.connection_, nullptr)),
      backend_pid_(other.backend_pid_),
      notified_(std::move(other.notified_)) {}

PqConnection& PqConnection::operator=(PqConnection&& other) noexcept {
  if (this != &other) {
    if (connection_ != nullptr) PQfinish(connection_);
    connection_ = std::exchange(other.connection_, nullptr);
    backend_pid_ = other.backend_pid_;
    notified_ = std::move(other.notified_);
  }
  return *this;
}

PqConnection::~PqConnection() {
  if (connection_ != nullptr) PQfinish(connection_);
}

bool PqConnection::usable() const noexcept {
  return connection_ != nullptr && PQstatus(connection_) == CONNECTION_OK;
}

bool PqConnection::close_handing_over(const std::function<bool(int socket)>& hand_over) noexcept {
  // A TLS or GSS stream cut without its closing message is logged by the
  // server; a busy connection's session would be in the middle of something.
  if (!usable() || PQtransactionStatus(connection_) != PQTRANS_IDLE || PQsslInUse(connection_) != 0 ||
      PQgssEncInUse(connection_) != 0)
    return false;
  const int socket = PQsocket(connection_);
  try {
    if (socket < 0 || !hand_over(socket)) return false;
  } catch (...) {
    return false;
  }
  // The Terminate message PQfinish sends then goes to a socket connected to
  // nothing (the send fails, which PQfinish ignores): put one in its place.
  // Should that fail, PQfinish ends the session as usual.
  if (const int inert = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); inert >= 0) {
    (void)::dup3(inert, socket, O_CLOEXEC);
    ::close(inert);
  }
  PQfinish(std::exchange(connection_, nullptr));
  return true;
}

Outcome<PqConnecting> PqConnecting::start(const std::string& conninfo) {
  PqConnecting connecting(PQconnectStart(conninfo.c_str()));
  if (connecting.connecting_ == nullptr)
    return tl::unexpected(StatementFailure{StatementFailure::Kind::client, {}, "out of memory", false});
  PQsetErrorVerbosity(connecting.connecting_, PQERRORS_VERBOSE);  // before the first answer: see connect_failure()
  if (PQstatus(connecting.connecting_) == CONNECTION_BAD)
    return tl::unexpected(connecting.fail(connect_failure(connecting.connecting_)).error());
  return connecting;
}

PqConnecting::PqConnecting(PqConnecting&& other) noexcept
    : connecting_(std::exchange(other.connecting_, nullptr)), wants_read_(other.wants_read_) {}

PqConnecting& PqConnecting::operator=(PqConnecting&& other) noexcept {
  if (this != &other) {
    if (connecting_ != nullptr) PQfinish(connecting_);
    connecting_ = std::exchange(other.connecting_, nullptr);
    wants_read_ = other.wants_read_;
  }
  return *this;
}

PqConnecting::~PqConnecting() {
  if (connecting_ != nullptr) PQfinish(connecting_);
}

Outcome<PqConnection> PqConnecting::fail(StatementFailure failure) {
  PQfinish(std::exchange(connecting_, nullptr));
  return tl::unexpected(std::move(failure));
}

Outcome<PqConnection> PqConnecting::poll_until(Deadline deadline) {
  if (connecting_ == nullptr)
    return tl::unexpected(StatementFailure{StatementFailure::Kind::connection_lost, {}, "no connect in progress", false});
  // libpq's contract: start as if PQconnectPoll had asked to write. The socket
  // may change between polls (another address, SSL, GSS): read it every time.
  for (;;) {
    const Ready ready = wait_socket(PQsocket(connecting_), wants_read_ ? POLLIN : POLLOUT, deadline);
    if (ready == Ready::timed_out) return tl::unexpected(timed_out("while connecting", false));
    if (ready == Ready::failed)
      return fail({StatementFailure::Kind::connection_lost, {}, "cannot wait for the connection's socket", false});
    const PostgresPollingStatusType status = PQconnectPoll(connecting_);
    if (status == PGRES_POLLING_FAILED) return fail(connect_failure(connecting_));
    if (status == PGRES_POLLING_OK) break;
    wants_read_ = status == PGRES_POLLING_READING;
  }
  PGconn* c = std::exchange(connecting_, nullptr);
  const auto failed = [&](StatementFailure f) -> Outcome<PqConnection> {
    PQfinish(c);
    return tl::unexpected(std::move(f));
  };
  // Never block in a send: a full socket buffer is waited for with the deadline.
  if (PQsetnonblocking(c, 1) != 0) return failed({StatementFailure::Kind::client, {}, trimmed(PQerrorMessage(c)), false});
  PQsetErrorVerbosity(c, PQERRORS_DEFAULT);
  // Notices (say, "relation exists, skipping") would go to stderr.
  PQsetNoticeProcessor(c, ignore_notice, nullptr);
  return PqConnection(c);
}

Outcome<PqConnection> PqConnection::open(const std::string& conninfo, Deadline deadline) {
  auto connecting = PqConnecting::start(conninfo);
  if (!connecting) return tl::unexpected(std::move(connecting.error()));
  return connecting->poll_until(deadline);  // a timeout drops the attempt with `connecting`
}

void PqConnection::abandon() noexcept {
  if (connection_ == nullptr) return;
  cancel_in_background(connection_);
  PQfinish(connection_);
  connection_ = nullptr;
}

StatementFailure PqConnection::broken(std::string_view during, bool sent) {
  std::string message = std::string(during) + ": " + trimmed(connection_ != nullptr ? PQerrorMessage(connection_) : "");
  abandon();
  return StatementFailure{StatementFailure::Kind::connection_lost, {}, std::move(message), sent};
}

void PqConnection::collect_notifications() {
  while (PGnotify* n = PQnotifies(connection_)) {
    // Our own releases wake nobody here: this session is the releaser.
    if (n->be_pid != backend_pid_) {
      if (notified_.size() >= max_pending_notifications) notified_.pop_front();
      notified_.push_back(Notification{n->relname, n->extra != nullptr ? n->extra : ""});
    }
    PQfreemem(n);
  }
}

template <class Send>
Outcome<Rows> PqConnection::run(Send&& send, Deadline deadline) {
  return run(std::forward<Send>(send), [this](Deadline d) { return read_results(d); }, deadline);
}

template <class Send, class Read>
Outcome<Rows> PqConnection::run(Send&& send, Read&& read, Deadline deadline) {
  if (!usable()) return tl::unexpected(broken("the connection is not open", false));
  if (send(connection_) == 0) {
    if (PQstatus(connection_) != CONNECTION_OK) return tl::unexpected(broken("sending the statement", false));
    return tl::unexpected(StatementFailure{StatementFailure::Kind::client, {}, trimmed(PQerrorMessage(connection_)), false});
  }
  // From here the statement may reach the server.
  for (;;) {
    const int flushed = PQflush(connection_);
    if (flushed == 0) break;
    if (flushed < 0) return tl::unexpected(broken("sending the statement", true));
    // The server may be blocked writing to us: read while waiting to write.
    const Ready ready = wait_socket(PQsocket(connection_), POLLOUT | POLLIN, deadline);
    if (ready == Ready::timed_out) {
      abandon();
      return tl::unexpected(timed_out("while sending the statement", true));
    }
    if (ready == Ready::failed || PQconsumeInput(connection_) == 0)
      return tl::unexpected(broken("sending the statement", true));
  }
  return read(deadline);
}


bool PqConnection::await_result(Deadline deadline, std::optional<StatementFailure>& failure) {
  while (PQisBusy(connection_) != 0) {
    const Ready ready = wait_socket(PQsocket(connection_), POLLIN, deadline);
    if (ready == Ready::timed_out) {
      abandon();
      failure = timed_out("waiting for the server's answer", true);
      return false;
    }
    if (ready == Ready::failed || PQconsumeInput(connection_) == 0) {
      failure = broken("reading the server's answer", true);
      return false;
    }
    collect_notifications();
  }
  return true;
}

Outcome<Rows> PqConnection::read_pipeline(Deadline deadline) {
  Rows rows;
  std::optional<StatementFailure> failure;
  // Each query's results end with a null; the sync's result ends the pipeline.
  for (int query = 0;;) {
    std::optional<StatementFailure> gone;
    if (!await_result(deadline, gone)) return tl::unexpected(std::move(*gone));
    PGresult* result = PQgetResult(connection_);
    if (result == nullptr) {
      ++query;
      if (PQstatus(connection_) != CONNECTION_OK || query > 2) break;
      continue;
    }
    const ExecStatusType status = PQresultStatus(result);
    if (status == PGRES_PIPELINE_SYNC) {
      PQclear(result);
      break;
    }
    if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK) {
      if (query == 1) rows = rows_of(result);
    } else if (status != PGRES_PIPELINE_ABORTED && !failure) {
      failure = failure_of(result);
    }
    PQclear(result);
  }
  if (PQstatus(connection_) == CONNECTION_OK) PQexitPipelineMode(connection_);
  collect_notifications();
  if (PQstatus(connection_) != CONNECTION_OK) {
    if (failure) {
      abandon();
      return tl::unexpected(std::move(*failure));
    }
    return tl::unexpected(broken("reading the server's answer", true));
  }
  if (failure) return tl::unexpected(std::move(*failure));
  return rows;
}

Outcome<Rows> PqConnection::read_results(Deadline deadline) {
  Rows rows;
  std::optional<StatementFailure> failure;
  for (;;) {
    while (PQisBusy(connection_) != 0) {
      const Ready ready = wait_socket(PQsocket(connection_), POLLIN, deadline);
      if (ready == Ready::timed_out) {
        abandon();
        return tl::unexpected(timed_out("waiting for the server's answer", true));
      }
      if (ready == Ready::failed || PQconsumeInput(connection_) == 0)
        return tl::unexpected(broken("reading the server's answer", true));
      collect_notifications();
    }
    PGresult* result = PQgetResult(connection_);
    if (result == nullptr) break;
    const ExecStatusType status = PQresultStatus(result);
    if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK) {
      // A multi-statement string yields a result each: the last one counts.
      rows = rows_of(result);
    } else if (!failure) {
      failure = failure_of(result);
    }
    PQclear(result);
  }
  collect_notifications();
  if (PQstatus(connection_) != CONNECTION_OK) {
    // The server may have said why before it closed (57P01: terminated).
    if (failure) {
      abandon();
      return tl::unexpected(std::move(*failure));
    }
    return tl::unexpected(broken("reading the server's answer", true));
  }
  if (failure) return tl::unexpected(std::move(*failure));
  return rows;
}

Outcome<Rows> PqConnection::prepare(const std::string& name, const std::string& sql, Deadline deadline) {
  return run([&](PGconn* c) { return PQsendPrepare(c, name.c_str(), sql.c_str(), 0, nullptr); }, deadline);
}


Outcome<Rows> PqConnection::exec_prepared(const std::string& name, const std::vector<std::string>& params,
                                          Deadline deadline) {
  const auto values = values_of(params);
  return run([&](PGconn* c) {
    return PQsendQueryPrepared(c, name.c_str(), static_cast<int>(values.size()), values.data(), nullptr, nullptr, 0);
  }, deadline);
}

Outcome<Rows> PqConnection::exec_params(const std::string& sql, const std::vector<std::string>& params,
                                        Deadline deadline) {
  const auto values = values_of(params);
  return run([&](PGconn* c) {
    return PQsendQueryParams(c, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr,
                             nullptr, 0);
  }, deadline);
}

Outcome<Rows> PqConnection::exec_params_after(const std::string& setup, const std::vector<std::string>& setup_params,
                                             const std::string& sql, const std::vector<std::string>& params,
                                             Deadline deadline) {
  if (!usable()) return tl::unexpected(broken("the connection is not open", false));
  if (PQenterPipelineMode(connection_) == 0)
    return tl::unexpected(StatementFailure{StatementFailure::Kind::client, {}, trimmed(PQerrorMessage(connection_)), false});
  const auto first = values_of(setup_params);
  const auto second = values_of(params);
  auto out = run(
      [&](PGconn* c) {
        return PQsendQueryParams(c, setup.c_str(), static_cast<int>(first.size()), nullptr, first.data(), nullptr,
                                 nullptr, 0) != 0 &&
                       PQsendQueryParams(c, sql.c_str(), static_cast<int>(second.size()), nullptr, second.data(),
                                         nullptr, nullptr, 0) != 0 &&
                       PQpipelineSync(c) != 0
                   ? 1
                   : 0;
      },
      [this](Deadline d) { return read_pipeline(d); }, deadline);
  // A send that failed before anything went out leaves the pipeline to close here.
  if (connection_ != nullptr && PQpipelineStatus(connection_) != PQ_PIPELINE_OFF &&
      PQexitPipelineMode(connection_) == 0)
    abandon();  // stuck in the pipeline: the next operation opens another connection
  return out;
}

Outcome<Rows> PqConnection::exec_simple(const std::string& sql, Deadline deadline) {
  return run([&](PGconn* c) { return PQsendQuery(c, sql.c_str()); }, deadline);
}

int PqConnection::reported_backend_pid() const noexcept {
  return connection_ != nullptr ? PQbackendPID(connection_) : 0;
}

std::string PqConnection::user() const {
  const char* name = connection_ != nullptr ? PQuser(connection_) : nullptr;
  return name != nullptr ? name : "";
}

void PqConnection::discard_notifications(std::string_view channel) {
  std::erase_if(notified_, [&](const Notification& n) { return n.channel == channel; });
}

int PqConnection::socket() const noexcept { return usable() ? PQsocket(connection_) : -1; }

bool PqConnection::consume_input() {
  if (!usable()) return false;
  if (PQconsumeInput(connection_) == 0) {
    abandon();
    return false;
  }
  collect_notifications();
  return true;
}

std::vector<Notification> PqConnection::take_notifications() {
  std::vector<Notification> out(std::make_move_iterator(notified_.begin()), std::make_move_iterator(notified_.end()));
  notified_.clear();
  return out;
}

std::vector<std::string> PqConnection::take_payloads(std::string_view channel) {
  std::vector<std::string> out;
  for (Notification& n : notified_)
    if (n.channel == channel) out.push_back(std::move(n.payload));
  discard_notifications(channel);
  return out;
}

Outcome<PqConnection::Woke> PqConnection::await_input(Deadline deadline, int wake_fd) {
  if (!usable()) return tl::unexpected(broken("the connection is not open", false));
  for (;;) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) return Woke::deadline;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    pollfd p[2] = {{PQsocket(connection_), POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int n = ::poll(p, wake_fd >= 0 ? 2 : 1, static_cast<int>(std::min<long long>(ms, 1 << 30)));
    if (n < 0) {
      if (errno == EINTR) continue;
      return tl::unexpected(broken("waiting for a notification", false));
    }
    if (n == 0) continue;  // re-check the clock
    if (wake_fd >= 0 && (p[1].revents & POLLIN) != 0) return Woke::wake_fd;
    if (PQconsumeInput(connection_) == 0) return tl::unexpected(broken("waiting for a notification", false));
    collect_notifications();
    return Woke::input;
  }
}

Outcome<bool> PqConnection::wait_for_notification(std::string_view channel, Deadline deadline) {
  if (!usable()) return tl::unexpected(broken("the connection is not open", false));
  const auto take = [&] {
    const auto before = notified_.size();
    discard_notifications(channel);
    return notified_.size() != before;
  };
  for (;;) {
    if (PQconsumeInput(connection_) == 0) return tl::unexpected(broken("waiting for a notification", false));
    collect_notifications();
    if (take()) return true;
    const Ready ready = wait_socket(PQsocket(connection_), POLLIN, deadline);
    if (ready == Ready::timed_out) return false;  // nothing in flight: the connection stays good
    if (ready == Ready::failed) return tl::unexpected(broken("waiting for a notification", false));
  }
}

}  // namespace pgmutex::postgres_detail
