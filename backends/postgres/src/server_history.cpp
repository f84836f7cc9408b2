// Asks a new connection which server history it reached (server_history.hpp).
#include "server_history.hpp"

namespace pgmutex::postgres_detail {

Outcome<void> ServerHistory::on_connect(PqConnection& connection, Deadline deadline) {
  std::string now;
  auto rows = connection.exec_simple(server_identity_sql, deadline);
  if (rows) {
    if (!rows->empty() && !rows->is_null(0, 0)) now = rows->text(0, 0);
  } else if (rows.error().kind != StatementFailure::Kind::server) {
    return tl::unexpected(std::move(rows.error()));  // the connection failed: the caller connects again
  }
  // Any refusal by the server (42501, a function missing): identity unknown.
  const bool first = !known_;
  known_ = true;
  identity_ = std::move(now);
  // Every new session after the first, same identity or not: a restart or a
  // server that closes idle sessions may have lost unflushed heartbeats, and
  // only the next durable one tells.
  if (!first) {
    ++history_;
    durable_heartbeat_due_ = true;
  }
  return {};
}

}  // namespace pgmutex::postgres_detail
