// The backend's own connection: opened on demand, with backoff, within the
// operation's deadline; its prepared statements, table oids, LISTENs and
// session statement_timeout remembered until it is dropped. Private to the backend.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "pgmutex/postgres_backend.hpp"
#include "host_attempts.hpp"
#include "server_history.hpp"
#include "session.hpp"

namespace pgmutex::postgres_detail {

class OwnSession final : public Session {
 public:
  OwnSession(std::string conninfo, std::string redacted, std::vector<std::string> secrets, PostgresOptions options);
  // Hands the connection over if the options ask (PostgresOptions::hand_over_at_close).
  ~OwnSession() override;

  // Connects unless connected: up to options.reconnect_attempts tries, backing off, never past the deadline.
  Result<void> ensure_connected(Deadline deadline);
  // Forgets the connection and all it knew; the next operation opens another.
  void drop() noexcept;
  // How many connections were opened: a new one may follow a server restart.
  [[nodiscard]] std::uint64_t connects() const noexcept { return connects_; }
  // Which server history the connections reached (a failover shows here).
  [[nodiscard]] ServerHistory& history() noexcept { return history_; }

  Outcome<Rows> run(const Statement& statement, const std::vector<std::string>& params, const Bound& bound) override;
  Outcome<Rows> run_text(const std::string& sql, const std::vector<std::string>& params, const Bound& bound) override;
  // Prepares `statement` on this connection now unless it is prepared
  // already (or nothing is prepared here: a transaction pooler). A queued
  // waiter does it for the statements of its handoff while it waits, so the
  // release that wakes it is not followed by a Parse on the critical path.
  Outcome<void> prepare(const Statement& statement, const Bound& bound);
  // Has the server plan `statements` (prepared here already) once per
  // connection (a Mutex that queues again is not asked again): one round
  // trip of EXPLAIN EXECUTE with NULL parameters, which runs nothing. The
  // plan is not kept (the connection's plan_cache_mode stays the server's);
  // what the first planning reads of the catalogs is, so the statement's own
  // planning later is a third of a fresh connection's (the release: about
  // 1 ms against 3.6). A waiter does it while it waits, for its handoff.
  // With PostgresOptions::generic_plans_for_handoff, the same round trip
  // first sets the session's plan_cache_mode to force_generic_plan (once
  // per connection), and the plans are kept: the statements then run unplanned.
  Outcome<void> plan_ahead(std::initializer_list<const Statement*> statements, const Bound& bound);
  Outcome<std::string> table_oid(std::string_view table, const Bound& bound) override;
  Outcome<bool> wait_for_notification(const std::string& channel, const Bound& bound, Deadline wait_until) override;
  [[nodiscard]] bool unnamed() const override;
  [[nodiscard]] std::string user() const override;
  // --- for pgmutex::Session's I/O thread, which waits on the socket itself
  // LISTENs on `channel` unless this connection already does (no cap: the
  // session UNLISTENs nothing while a waiter may need it).
  Outcome<void> listen(const std::string& channel, const Bound& bound);
  Outcome<void> listen(const std::vector<std::string>& channels, const Bound& bound);
  // The socket to poll() (-1: no usable connection).
  [[nodiscard]] int socket() const noexcept { return connection_ ? connection_->socket() : -1; }
  // Reads what arrived; false (and the connection dropped) if it is gone.
  bool consume_input();
  // The NOTIFYs since the last call (read by any statement or read).
  std::vector<Notification> take_notifications();
  // --- for a queued waiter of the backend (queue_waits.cpp), which blocks
  // on the socket itself: whether `channel` is LISTENed on the connection
  // now, the payloads notified on it, and a wait for input (see PqConnection).
  [[nodiscard]] bool listening(const std::string& channel) const { return connected() && listening_.contains(channel); }
  std::vector<std::string> take_payloads(const std::string& channel);
  Outcome<PqConnection::Woke> await_input(Deadline deadline, int wake_fd);
  int reported_backend_pid() const override;
  // NOTIFYs this connection sent itself are kept too (by default they are
  // not: a backend's own release wakes nobody it serves). A session's
  // releases must wake the session's other waiters.
  void hear_own_notifications() noexcept { hear_own_ = true; }
  [[nodiscard]] bool connected() const noexcept { return connection_ && connection_->usable(); }
  // Statements sent to the server so far (set-up, PREPARE and SET included).
  [[nodiscard]] std::uint64_t statements() const noexcept { return statements_; }

  // A pooler is in front of the server (found by StatementMode::automatic's
  // probe on the current connection).
  [[nodiscard]] bool behind_pooler() const noexcept { return behind_pooler_; }

 private:
  // Asks the server for pg_backend_pid() (unless StatementMode::unnamed): a
  // pooler reported another in the connection's start-up. Our own NOTIFYs
  // come from it.
  Outcome<void> probe_pooler(Deadline deadline);
  // Opens a connection to the server. With one host, a connect cut short by
  // the operation's deadline goes on: the next call resumes it, within its
  // own budget (connect_timeout). With several, open_first.
  Outcome<PqConnection> open_server(const std::vector<HostAttempt>& hosts, std::chrono::nanoseconds per_host,
                                    Deadline deadline);
  // statement_timeout must be in force before a statement starts, so it is a
  // session setting, sent only when an operation asks for another value.
  Outcome<void> use_statement_timeout(const Bound& bound);
  PqConnection& connection() { return *connection_; }

  std::string conninfo_;
  std::string redacted_;
  std::vector<std::string> secrets_;
  PostgresOptions options_;
  std::optional<PqConnection> connection_;
  // A connect in progress that an operation's deadline cut short, and when
  // its own budget ends; a connection made as the deadline passed, not yet
  // identified.
  std::optional<PqConnecting> connecting_;
  Deadline connecting_until_{};
  std::optional<PqConnection> unidentified_;
  std::uint64_t connects_ = 0;
  ServerHistory history_;
  std::unordered_set<std::string> prepared_;
  std::unordered_set<std::string> planned_;  // planned ahead on this connection
  bool generic_plans_ = false;               // plan_cache_mode = force_generic_plan set on this connection
  std::map<std::string, std::string, std::less<>> oids_;
  std::set<std::string, std::less<>> listening_;
  long long statement_timeout_ms_ = -1;  // -1: not set on this connection
  bool behind_pooler_ = false;
  std::uint64_t statements_ = 0;
  bool hear_own_ = false;
};

}  // namespace pgmutex::postgres_detail
