// The Asio engine's state and its protocol steps, written once as a
// non-template resumable algorithm: each step calls libpq's non-blocking API
// and says what it waits for next (read, write, either, or done). The
// composed operation in asio_pq_connection.hpp drives it; the steps live in
// asio_pq_engine.cpp, the only file of the engine that includes libpq.
// Private to the backend.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/system/error_code.hpp>

#include "statement_outcome.hpp"

struct pg_conn;

namespace pgmutex::postgres_detail {

// The same clock as PqConnection's Deadline and Asio's steady_timer.
using AsioDeadline = std::chrono::steady_clock::time_point;

// Why an operation failed, as an error code; the details (SQLSTATE, message,
// whether a statement may have reached the server) are in last_failure(), a
// StatementFailure, so error_mapping.hpp turns them into pgmutex errors as it
// does for the blocking engine. Cancellation is asio::error::operation_aborted.
enum class PqErrc {
  server_error = 1,  // the server refused the statement (StatementFailure::Kind::server)
  timed_out,         // the deadline passed; the connection was discarded (Kind::timeout)
  connection_lost,   // the connection broke (Kind::connection_lost)
  client_error,      // libpq refused before sending (Kind::client)
  busy,              // another operation is running on this connection
  not_connected,     // no usable connection: connect (again) first
};

const boost::system::error_category& pq_category() noexcept;
boost::system::error_code make_error_code(PqErrc e) noexcept;

}  // namespace pgmutex::postgres_detail

template <>
struct boost::system::is_error_code_enum<pgmutex::postgres_detail::PqErrc> : std::true_type {};

namespace pgmutex::postgres_detail {

// One statement of an exchange.
struct PqStatement {
  enum class Kind { prepared, params, prepare };
  Kind kind = Kind::params;
  std::string text;  // prepared, prepare: the statement's name; params: the SQL
  std::string sql;   // prepare: the SQL
  std::vector<std::string> params;

  static PqStatement prepared(std::string name, std::vector<std::string> params) {
    return {Kind::prepared, std::move(name), {}, std::move(params)};
  }
  static PqStatement with_params(std::string sql, std::vector<std::string> params) {
    return {Kind::params, std::move(sql), {}, std::move(params)};
  }
  static PqStatement prepare(std::string name, std::string sql) {
    return {Kind::prepare, std::move(name), std::move(sql), {}};
  }
};

// Where a pipeline's statements end their implicit transactions.
enum class PipelineSync {
  after_each,  // each statement its own transaction: one failing leaves the others (batched heartbeats)
  once,        // all in one transaction: a failure aborts the rest (PGRES_PIPELINE_ABORTED, reported as 25P02)
};

// What the composed operation waits for next.
enum class PqWant { done, read, write, read_or_write };

// Counters a test or benchmark reads: how often an operation waited.
struct PqIoCounters {
  std::size_t read_waits = 0;
  std::size_t write_waits = 0;  // including read-or-write waits
};

// The connection's state and the non-template protocol steps. Shared by the
// handle and its pending operation, so an operation outlives a destroyed handle.
class PqEngine {
 public:
  explicit PqEngine(const boost::asio::any_io_executor& executor);
  PqEngine(const PqEngine&) = delete;
  PqEngine& operator=(const PqEngine&) = delete;
  ~PqEngine();

  // Each starts an operation's algorithm and returns its first wait.
  PqWant start_connect(const std::string& conninfo);
  PqWant start_exchange(std::vector<PqStatement> statements, bool pipeline, PipelineSync sync);
  PqWant start_notification_wait(std::string channel);
  // After the socket got ready: the next step.
  PqWant resume();
  // The operation ends early: its deadline passed, it was cancelled, or the wait failed.
  void deadline_passed();
  void cancelled();
  void wait_failed(const boost::system::error_code& ec);
  // The handle is gone: the socket is released (pending waits end) and the connection discarded.
  void close() noexcept;
  // The operation is over (however it ended).
  void end_operation() noexcept;

  [[nodiscard]] bool closed() const noexcept { return closed_; }
  [[nodiscard]] bool usable() const noexcept;
  [[nodiscard]] boost::system::error_code error() const noexcept { return error_; }
  [[nodiscard]] const StatementFailure& last_failure() const noexcept { return last_failure_; }
  [[nodiscard]] int backend_pid() const noexcept { return backend_pid_; }
  [[nodiscard]] const PqIoCounters& counters() const noexcept { return counters_; }
  void discard_notifications(std::string_view channel);

  Rows take_rows();
  std::vector<Outcome<Rows>> take_results();
  bool take_notified() noexcept { return std::exchange(notified_, false); }

  boost::asio::any_io_executor executor;
  boost::asio::posix::stream_descriptor socket;
  boost::asio::steady_timer timer;
  bool busy = false;

 private:
  enum class Mode { idle, connect, exchange, notification };
  enum class Phase { flush, read };

  PqWant connect_step();
  PqWant exchange_step(bool woke);
  PqWant read_single();
  PqWant read_pipeline();
  PqWant notification_step();
  PqWant finish_exchange();
  PqWant fail(StatementFailure failure, bool cancel_statement);
  PqWant broken(std::string_view during);
  bool consume_input();
  void collect_notifications();
  void rewrap_socket();
  void discard(bool cancel_statement) noexcept;
  PqWant counted(PqWant want) noexcept;

  pg_conn* connection_ = nullptr;
  int backend_pid_ = 0;
  bool closed_ = false;
  Mode mode_ = Mode::idle;
  int poll_status_ = 0;  // PostgresPollingStatusType while connecting
  std::vector<PqStatement> statements_;
  bool pipeline_ = false;
  PipelineSync sync_ = PipelineSync::after_each;
  Phase phase_ = Phase::flush;
  bool sent_ = false;
  std::size_t current_ = 0;
  bool current_has_result_ = false;
  std::size_t syncs_expected_ = 0;
  std::size_t syncs_seen_ = 0;
  std::vector<Outcome<Rows>> results_;
  std::string channel_;
  bool notified_ = false;
  // NOTIFYs from other sessions, counted per channel; at most this many channels kept.
  static constexpr std::size_t max_notified_channels = 1024;
  std::map<std::string, std::size_t, std::less<>> notifications_;
  boost::system::error_code error_;
  StatementFailure last_failure_;
  PqIoCounters counters_;
};

}  // namespace pgmutex::postgres_detail
