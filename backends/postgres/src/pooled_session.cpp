// A connection borrowed from the user's libpqxx pool as a Session
// (pooled_session.hpp): statements and waits for NOTIFY through libpqxx,
// its results read into Rows.
#include "pooled_session.hpp"

#include <pqxx/pqxx>

#include "dsn.hpp"
#include "error_mapping.hpp"

namespace pgmutex::postgres_detail {

std::uint64_t PooledSession::server_pid() const { return static_cast<std::uint64_t>(connection_.backendpid()); }
std::string PooledSession::user() const {
  const char* name = connection_.username();
  return name != nullptr ? name : "";
}
namespace {

Rows rows_of(const pqxx::result& result) {
  Rows rows;
  rows.rows.reserve(result.size());
  for (const pqxx::row& row : result) {
    auto& out = rows.rows.emplace_back();
    out.reserve(row.size());
    for (const pqxx::field& field : row) {
      if (field.is_null()) out.emplace_back(std::nullopt);
      else out.emplace_back(std::string(field.c_str(), field.size()));
    }
  }
  rows.affected = static_cast<long>(result.affected_rows());
  return rows;
}

// Notes that a channel was notified by another session than ours.
class ReleaseListener final : public pqxx::notification_receiver {
 public:
  ReleaseListener(pqxx::connection& connection, const std::string& channel)
      : pqxx::notification_receiver(connection, channel), own_pid_(connection.backendpid()) {}
  void operator()(const std::string&, int backend_pid) override {
    if (backend_pid != own_pid_) fired_ = true;
  }
  [[nodiscard]] bool fired() const noexcept { return fired_; }

 private:
  int own_pid_;
  bool fired_ = false;
};

}  // namespace

Result<std::unique_ptr<PooledSession>> PooledSession::borrow(ConnectionSource& source,
                                                              const std::vector<std::string>& secrets, bool unnamed) {
  try {
    pqxx::connection& connection = source.borrow();
    try {
      return std::unique_ptr<PooledSession>(new PooledSession(source, connection, unnamed));
    } catch (...) {
      source.give_back(connection);
      throw;
    }
  } catch (...) {
    const StatementFailure failure = failure_from_current_exception();
    return fail(Errc::backend_unavailable,
                "cannot borrow a connection from the pool: " + scrub(failure.message, secrets));
  }
}

// Given back dead or alive: the pool decides.
PooledSession::~PooledSession() { source_.give_back(connection_); }

Outcome<Rows> PooledSession::run(const Statement& statement, const std::vector<std::string>& params, const Bound& bound) {
  if (unnamed_) return run_text(statement.sql, params, bound);
  try {
    // libpqxx accepts an identical redefinition, so a borrowed connection is simply told again.
    connection_.prepare(statement.name, statement.sql);
    pqxx::nontransaction tx(connection_);
    return rows_of(tx.exec_prepared(statement.name, pqxx::prepare::make_dynamic_params(params)));
  } catch (...) {
    return tl::unexpected(failure_from_current_exception());
  }
}

Outcome<Rows> PooledSession::run_text(const std::string& sql, const std::vector<std::string>& params, const Bound&) {
  try {
    pqxx::nontransaction tx(connection_);
    if (params.empty()) return rows_of(tx.exec(sql));
    return rows_of(tx.exec_params(sql, pqxx::prepare::make_dynamic_params(params)));
  } catch (...) {
    return tl::unexpected(failure_from_current_exception());
  }
}

Outcome<std::string> PooledSession::table_oid(std::string_view table, const Bound& bound) {
  // Asked on every borrow: we cannot tell whether a pooled connection is the one we asked before.
  auto rows = run_text(std::string(table_oid_sql), {quote_table(table)}, bound);
  if (!rows) return tl::unexpected(std::move(rows.error()));
  return rows->text(0, 0);
}

Outcome<bool> PooledSession::wait_for_notification(const std::string& channel, const Bound&, Deadline wait_until) {
  try {
    // LISTEN and UNLISTEN within this one borrow: the connection goes back as it came.
    ReleaseListener listener(connection_, channel);
    connection_.get_notifs();
    if (listener.fired()) return true;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::microseconds>(wait_until - std::chrono::steady_clock::now());
      if (left <= std::chrono::microseconds::zero()) return false;
      connection_.await_notification(static_cast<long>(left.count() / 1000000), static_cast<long>(left.count() % 1000000));
      if (listener.fired()) return true;
    }
  } catch (...) {
    return tl::unexpected(failure_from_current_exception());
  }
}

}  // namespace pgmutex::postgres_detail
