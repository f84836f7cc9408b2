#include "asio_pq_engine.hpp"

#include <algorithm>
#include <cstdlib>

#include <boost/asio/error.hpp>

#include <libpq-fe.h>

#include "pq_cancel.hpp"
#include "pq_results.hpp"

namespace pgmutex::postgres_detail {
namespace {

class PqCategory final : public boost::system::error_category {
 public:
  [[nodiscard]] const char* name() const noexcept override { return "pgmutex.postgres.asio"; }
  [[nodiscard]] std::string message(int value) const override {
    switch (static_cast<PqErrc>(value)) {
      case PqErrc::server_error: return "the server refused the statement";
      case PqErrc::timed_out: return "the operation's deadline passed";
      case PqErrc::connection_lost: return "the connection to the server was lost";
      case PqErrc::client_error: return "libpq refused the statement before sending it";
      case PqErrc::busy: return "another operation is running on this connection";
      case PqErrc::not_connected: return "not connected";
    }
    return "unknown error";
  }
};

void ignore_notice(void*, const char*) {}

PqErrc errc_of(StatementFailure::Kind kind) noexcept {
  switch (kind) {
    case StatementFailure::Kind::server: return PqErrc::server_error;
    case StatementFailure::Kind::timeout: return PqErrc::timed_out;
    case StatementFailure::Kind::connection_lost: return PqErrc::connection_lost;
    case StatementFailure::Kind::client: return PqErrc::client_error;
  }
  return PqErrc::client_error;
}


// A result as rows, or the server's refusal.
Outcome<Rows> outcome_of(PGresult* result) {
  const ExecStatusType status = PQresultStatus(result);
  if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK) return rows_of(result);
  if (status == PGRES_PIPELINE_ABORTED)
    return tl::unexpected(StatementFailure{StatementFailure::Kind::server, "25P02",
                                           "not run: an earlier statement of its transaction in the pipeline failed",
                                           false});
  return tl::unexpected(failure_of(result));
}

int send(PGconn* c, const PqStatement& s) {
  switch (s.kind) {
    case PqStatement::Kind::prepare:
      return PQsendPrepare(c, s.text.c_str(), s.sql.c_str(), 0, nullptr);
    case PqStatement::Kind::prepared: {
      const auto values = values_of(s.params);
      return PQsendQueryPrepared(c, s.text.c_str(), static_cast<int>(values.size()), values.data(), nullptr, nullptr,
                                 0);
    }
    case PqStatement::Kind::params: {
      const auto values = values_of(s.params);
      return PQsendQueryParams(c, s.text.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr,
                               nullptr, 0);
    }
  }
  return 0;
}

}  // namespace

const boost::system::error_category& pq_category() noexcept {
  static const PqCategory category;
  return category;
}

boost::system::error_code make_error_code(PqErrc e) noexcept { return {static_cast<int>(e), pq_category()}; }

PqEngine::PqEngine(const boost::asio::any_io_executor& ex) : executor(ex), socket(ex), timer(ex) {}

PqEngine::~PqEngine() { discard(false); }

bool PqEngine::usable() const noexcept { return connection_ != nullptr && PQstatus(connection_) == CONNECTION_OK; }

void PqEngine::close() noexcept {
  closed_ = true;
  timer.cancel();
  // A pending wait ends with operation_aborted; the operation then discards the connection.
  if (busy) {
    if (socket.is_open()) (void)socket.release();
    return;
  }
  discard(false);
}

void PqEngine::discard(bool cancel_statement) noexcept {
  // Asio must never close libpq's socket: release it first, then PQfinish closes it.
  if (socket.is_open()) (void)socket.release();
  if (connection_ == nullptr) return;
  if (cancel_statement) cancel_in_background(connection_);  // a detached thread: never on the event loop
  PQfinish(connection_);
  connection_ = nullptr;
}

void PqEngine::rewrap_socket() {
  // libpq may have closed the old socket and opened another, possibly with the
  // same number: always re-register, so epoll watches the socket libpq uses now.
  if (socket.is_open()) (void)socket.release();
  const int fd = PQsocket(connection_);
  if (fd < 0) return;
  boost::system::error_code ec;
  socket.assign(fd, ec);
}

PqWant PqEngine::counted(PqWant want) noexcept {
  if (want == PqWant::read) ++counters_.read_waits;
  if (want == PqWant::write || want == PqWant::read_or_write) ++counters_.write_waits;
  return want;
}

PqWant PqEngine::fail(StatementFailure failure, bool cancel_statement) {
  error_ = errc_of(failure.kind);
  last_failure_ = std::move(failure);
  discard(cancel_statement);
  return PqWant::done;
}

PqWant PqEngine::broken(std::string_view during) {
  std::string message = std::string(during) + ": " + trimmed(connection_ != nullptr ? PQerrorMessage(connection_) : "");
  return fail({StatementFailure::Kind::connection_lost, {}, std::move(message), sent_}, false);
}

void PqEngine::end_operation() noexcept {
  mode_ = Mode::idle;
  statements_.clear();
  if (closed_) discard(false);
}

// ---- connect ----------------------------------------------------------------

PqWant PqEngine::start_connect(const std::string& conninfo) {
  discard(false);
  error_ = {};
  last_failure_ = {};
  mode_ = Mode::connect;
  sent_ = false;
  notifications_.clear();
  connection_ = PQconnectStart(conninfo.c_str());
  if (connection_ == nullptr) return fail({StatementFailure::Kind::client, {}, "out of memory", false}, false);
  PQsetErrorVerbosity(connection_, PQERRORS_VERBOSE);  // before the first answer: see connect_failure()
  if (PQstatus(connection_) == CONNECTION_BAD) return fail(connect_failure(connection_), false);
  // libpq's contract: start as if PQconnectPoll had asked to write.
  poll_status_ = PGRES_POLLING_WRITING;
  rewrap_socket();
  return counted(PqWant::write);
}

PqWant PqEngine::connect_step() {
  poll_status_ = PQconnectPoll(connection_);
  rewrap_socket();  // after every poll: the socket may have changed
  switch (static_cast<PostgresPollingStatusType>(poll_status_)) {
    case PGRES_POLLING_READING:
      return counted(PqWant::read);
    case PGRES_POLLING_WRITING:
      return counted(PqWant::write);
    case PGRES_POLLING_OK:
      break;
    default:
      return fail(connect_failure(connection_), false);
  }
  if (PQsetnonblocking(connection_, 1) != 0)
    return fail({StatementFailure::Kind::client, {}, trimmed(PQerrorMessage(connection_)), false}, false);
  PQsetErrorVerbosity(connection_, PQERRORS_DEFAULT);
  PQsetNoticeProcessor(connection_, ignore_notice, nullptr);
  backend_pid_ = PQbackendPID(connection_);
  return PqWant::done;
}

// ---- statements -------------------------------------------------------------

PqWant PqEngine::start_exchange(std::vector<PqStatement> statements, bool pipeline, PipelineSync sync) {
  error_ = {};
  last_failure_ = {};
  mode_ = Mode::exchange;
  statements_ = std::move(statements);
  pipeline_ = pipeline;
  sync_ = sync;
  phase_ = Phase::flush;
  sent_ = false;
  current_ = 0;
  current_has_result_ = false;
  syncs_seen_ = 0;
  syncs_expected_ = pipeline ? (sync == PipelineSync::after_each ? statements_.size() : 1) : 0;
  results_.assign(statements_.size(), Outcome<Rows>(Rows{}));
  if (!usable()) {
    error_ = PqErrc::not_connected;
    last_failure_ = {StatementFailure::Kind::connection_lost, {}, "not connected", false};
    return PqWant::done;
  }
  if (statements_.empty()) return PqWant::done;
  if (pipeline_ && PQenterPipelineMode(connection_) != 1)
    return fail({StatementFailure::Kind::client, {}, trimmed(PQerrorMessage(connection_)), false}, false);
  for (const PqStatement& s : statements_) {
    if (send(connection_, s) == 0) {
      // Part of a pipeline may already be out: nothing can tell which ran.
      if (sent_ || PQstatus(connection_) != CONNECTION_OK) return broken("sending the statement");
      return fail({StatementFailure::Kind::client, {}, trimmed(PQerrorMessage(connection_)), false}, false);
    }
    sent_ = true;  // from here a statement may reach the server
    if (pipeline_ && sync_ == PipelineSync::after_each && PQpipelineSync(connection_) != 1)
      return broken("sending the statement");
  }
  if (pipeline_ && sync_ == PipelineSync::once && PQpipelineSync(connection_) != 1)
    return broken("sending the statement");
  return exchange_step(false);
}

PqWant PqEngine::exchange_step(bool woke) {
  if (phase_ == Phase::flush) {
    // The server may be blocked writing to us: read whatever came while waiting to write.
    if (woke && !consume_input()) return broken("sending the statement");
    const int flushed = PQflush(connection_);
    if (flushed < 0) return broken("sending the statement");
    if (flushed > 0) return counted(PqWant::read_or_write);
    phase_ = Phase::read;
  } else if (woke && !consume_input()) {
    return broken("reading the server's answer");
  }
  return pipeline_ ? read_pipeline() : read_single();
}

PqWant PqEngine::read_single() {
  Outcome<Rows>& result = results_.front();
  for (;;) {
    if (PQisBusy(connection_) != 0) return counted(PqWant::read);
    PGresult* r = PQgetResult(connection_);
    if (r == nullptr) break;
    // A multi-statement string yields a result each: the last one counts, the first failure wins.
    if (result.has_value()) result = outcome_of(r);
    PQclear(r);
  }
  return finish_exchange();
}

PqWant PqEngine::read_pipeline() {
  // Per statement: its result, then NULL. Per sync: PGRES_PIPELINE_SYNC.
  int nulls_in_a_row = 0;
  while (syncs_seen_ < syncs_expected_) {
    if (PQisBusy(connection_) != 0) return counted(PqWant::read);
    PGresult* r = PQgetResult(connection_);
    if (r == nullptr) {
      if (current_has_result_) {
        ++current_;
        current_has_result_ = false;
        nulls_in_a_row = 0;
      } else if (++nulls_in_a_row > 1) {
        return broken("reading the pipeline's results (libpq has none pending)");
      }
      continue;
    }
    nulls_in_a_row = 0;
    if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
      ++syncs_seen_;
    } else if (current_ < results_.size()) {
      if (results_[current_].has_value()) results_[current_] = outcome_of(r);
      current_has_result_ = true;
    }
    PQclear(r);
  }
  if (PQexitPipelineMode(connection_) != 1) return broken("leaving pipeline mode");
  return finish_exchange();
}

PqWant PqEngine::finish_exchange() {
  collect_notifications();
  const bool failed = !results_.empty() && !results_.front().has_value();
  if (PQstatus(connection_) != CONNECTION_OK) {
    // The server may have said why before it closed (57P01: terminated).
    if (!pipeline_ && failed) return fail(results_.front().error(), false);
    return broken("reading the server's answer");
  }
  if (!pipeline_ && failed) {
    error_ = errc_of(results_.front().error().kind);
    last_failure_ = results_.front().error();
  }
  return PqWant::done;
}

Rows PqEngine::take_rows() {
  if (results_.empty() || !results_.front().has_value() || error_) return {};
  return std::move(*results_.front());
}

std::vector<Outcome<Rows>> PqEngine::take_results() {
  if (error_) return {};
  return std::exchange(results_, {});
}

// ---- notifications ----------------------------------------------------------

bool PqEngine::consume_input() {
  if (PQconsumeInput(connection_) == 0) return false;
  collect_notifications();
  return true;
}

void PqEngine::collect_notifications() {
  while (PGnotify* n = PQnotifies(connection_)) {
    // Our own releases wake nobody here: this session is the releaser.
    if (n->be_pid != backend_pid_) {
      const auto at = notifications_.find(std::string_view(n->relname));
      if (at != notifications_.end()) ++at->second;
      else if (notifications_.size() < max_notified_channels) notifications_.emplace(n->relname, 1);
    }
    PQfreemem(n);
  }
}

void PqEngine::discard_notifications(std::string_view channel) {
  if (const auto at = notifications_.find(channel); at != notifications_.end()) notifications_.erase(at);
}

PqWant PqEngine::start_notification_wait(std::string channel) {
  error_ = {};
  last_failure_ = {};
  mode_ = Mode::notification;
  sent_ = false;
  notified_ = false;
  channel_ = std::move(channel);
  if (!usable()) {
    error_ = PqErrc::not_connected;
    last_failure_ = {StatementFailure::Kind::connection_lost, {}, "not connected", false};
    return PqWant::done;
  }
  return notification_step();
}

PqWant PqEngine::notification_step() {
  if (!consume_input()) return broken("waiting for a notification");
  if (const auto at = notifications_.find(std::string_view(channel_)); at != notifications_.end()) {
    notifications_.erase(at);
    notified_ = true;
    return PqWant::done;
  }
  return counted(PqWant::read);
}

// ---- the driver's calls -----------------------------------------------------

PqWant PqEngine::resume() {
  switch (mode_) {
    case Mode::connect:
      return connect_step();
    case Mode::exchange:
      return exchange_step(true);
    case Mode::notification:
      return notification_step();
    case Mode::idle:
      break;
  }
  return PqWant::done;
}

void PqEngine::deadline_passed() {
  if (mode_ == Mode::notification) return;  // nothing in flight: no notification, the connection stays
  const char* during = mode_ == Mode::connect ? "timed out while connecting"
                       : phase_ == Phase::flush ? "timed out while sending the statement"
                                                : "timed out waiting for the server's answer";
  (void)fail({StatementFailure::Kind::timeout, {}, during, sent_}, mode_ == Mode::exchange);
}

void PqEngine::cancelled() {
  error_ = boost::asio::error::operation_aborted;
  if (mode_ == Mode::notification && !closed_) return;  // nothing in flight
  last_failure_ = {StatementFailure::Kind::connection_lost, {}, "the operation was cancelled", sent_};
  discard(mode_ == Mode::exchange);
}

void PqEngine::wait_failed(const boost::system::error_code& ec) {
  (void)fail({StatementFailure::Kind::connection_lost, {}, "waiting for the socket: " + ec.message(), sent_},
             mode_ == Mode::exchange);
}

}  // namespace pgmutex::postgres_detail
