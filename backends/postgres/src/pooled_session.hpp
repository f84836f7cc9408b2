// A connection borrowed from the user's pool for one operation, through
// libpqxx, and given back when this object ends. libpqxx 6's calls block, so
// only the server can bound them: lock waits end at the statement's
// lock_timeout, but statement_timeout is not set (it would outlive the borrow
// as session state) and a frozen peer is found only by the connection's TCP
// settings. Private to the backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pgmutex/postgres_pool.hpp"
#include "session.hpp"

namespace pgmutex::postgres_detail {

class PooledSession final : public Session {
 public:
  // Borrows; a pool that throws is reported as backend_unavailable.
  // `unnamed`: StatementMode::unnamed (a pool is never probed: automatic is prepared).
  static Result<std::unique_ptr<PooledSession>> borrow(ConnectionSource& source, const std::vector<std::string>& secrets,
                                                       bool unnamed);
  ~PooledSession() override;

  Outcome<Rows> run(const Statement& statement, const std::vector<std::string>& params, const Bound& bound) override;
  Outcome<Rows> run_text(const std::string& sql, const std::vector<std::string>& params, const Bound& bound) override;
  Outcome<std::string> table_oid(std::string_view table, const Bound& bound) override;
  Outcome<bool> wait_for_notification(const std::string& channel, const Bound& bound, Deadline wait_until) override;
  [[nodiscard]] bool unnamed() const override { return unnamed_; }
  [[nodiscard]] std::string user() const override;
  // The server process behind the borrowed connection: another after a restart.
  [[nodiscard]] std::uint64_t server_pid() const;

 private:
  PooledSession(ConnectionSource& source, pqxx::connection& connection, bool unnamed) noexcept
      : source_(source), connection_(connection), unnamed_(unnamed) {}
  ConnectionSource& source_;
  pqxx::connection& connection_;
  bool unnamed_;
};

}  // namespace pgmutex::postgres_detail
