// A connection as the backend's operations see it, whichever engine is under
// it (our own libpq connection, or one borrowed from the user's libpqxx pool):
// each operation is written once, against this. Private to the backend.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "pq_connection.hpp"
#include "sql.hpp"
#include "statement_outcome.hpp"

namespace pgmutex::postgres_detail {

// How long one operation may take: the client's deadline, and the server-side
// timeouts derived from the same budget, shorter so the server's own, clean
// refusal usually comes before the client has to give up on the connection.
struct Bound {
  Deadline deadline;
  std::chrono::milliseconds statement_timeout;
  std::chrono::milliseconds lock_timeout;

  static Bound from(std::chrono::nanoseconds timeout);
  [[nodiscard]] std::string lock_timeout_param() const { return std::to_string(lock_timeout.count()); }
};

class Session {
 public:
  Session() = default;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  virtual ~Session() = default;

  // A prepared statement, prepared on this connection first if need be.
  virtual Outcome<Rows> run(const Statement& statement, const std::vector<std::string>& params, const Bound& bound) = 0;
  // Text: one statement with parameters, or, without, several in one implicit transaction.
  virtual Outcome<Rows> run_text(const std::string& sql, const std::vector<std::string>& params,
                                 const Bound& bound) = 0;
  // The table's oid as text (the lock's identity in Postgres).
  virtual Outcome<std::string> table_oid(std::string_view table, const Bound& bound) = 0;
  // LISTENs on `channel` (within `bound`), then waits until `wait_until` for a NOTIFY from another session.
  // Never called when unnamed(): the backend polls instead.
  virtual Outcome<bool> wait_for_notification(const std::string& channel, const Bound& bound, Deadline wait_until) = 0;
  // Statements go unnamed, settings stay inside one statement, no LISTEN
  // (StatementMode::unnamed, or automatic behind a pooler).
  [[nodiscard]] virtual bool unnamed() const = 0;
  // The server process id the connection reported at start-up, if it is
  // ours alone to the end (0: a borrowed or pooled one). A queued waiter is
  // bound to that backend's life when the server agrees it is its own.
  [[nodiscard]] virtual int reported_backend_pid() const { return 0; }
  // The role this connection logged in as (for the GRANT a refusal needs).
  [[nodiscard]] virtual std::string user() const = 0;
};

}  // namespace pgmutex::postgres_detail
