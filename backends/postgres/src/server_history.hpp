// Which server history a connection reached: the cluster's system identifier
// and its current timeline (for logs and tests), and a count that grows at
// every new server session after the first. A physical standby promoted
// after a failover keeps the system identifier but starts a new timeline;
// another cluster has another identifier; and a server that closed our
// session (a restart, idle_session_timeout, pg_terminate_backend) may have
// forgotten heartbeats it acknowledged but had not flushed (asynchronous
// commits). Whichever it was, what an earlier session acknowledged is no
// proof in this one, so the backend reports a new history and its next
// heartbeat commits synchronously (see PostgresBackend::history()). Counting
// every reconnect, not only a changed identity, keeps a lock alive on a
// server that closes every idle connection: each beat then meets a new
// session, and only a durable one can be trusted. Private to the backend.
#pragma once

#include <cstdint>
#include <string>

#include "pq_connection.hpp"

namespace pgmutex::postgres_detail {

// The identity as one text: "<system identifier>/<timeline, 8 hex digits>".
// The timeline is the one WAL is written on now (pg_walfile_name of the
// current WAL position: pg_control_checkpoint()'s timeline_id lags after a
// promotion until the next checkpoint completes). Both functions are
// executable by PUBLIC by default. "" when the server will not say
// (a privilege revoked, or a server in recovery: no current WAL position).
inline constexpr const char* server_identity_sql =
    "SELECT (SELECT system_identifier FROM pg_control_system())::text || '/' ||"
    " CASE WHEN pg_is_in_recovery() THEN 'recovery' ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END";

class ServerHistory {
 public:
  // Asks the server just connected to who it is (identity() "" when it
  // will not say: 42501, pg_control_system() revoked), and starts a new
  // history unless this is the first connection. Fails only if the
  // connection failed.
  Outcome<void> on_connect(PqConnection& connection, Deadline deadline);

  // Starts at 0; grows by one at every connection after the first (a new
  // server session: the same server, or a promoted standby, or another cluster).
  [[nodiscard]] std::uint64_t history() const noexcept { return history_; }
  // The last identity read ("" unknown).
  [[nodiscard]] const std::string& identity() const noexcept { return identity_; }

  // A heartbeat must commit synchronously before heartbeats go back to
  // asynchronous commits: set by a new history (any reconnect), cleared by a
  // durable heartbeat.
  [[nodiscard]] bool durable_heartbeat_due() const noexcept { return durable_heartbeat_due_; }
  void durable_heartbeat_done() noexcept { durable_heartbeat_due_ = false; }

 private:
  bool known_ = false;  // a first connection was made
  std::string identity_;
  std::uint64_t history_ = 0;
  bool durable_heartbeat_due_ = false;
};

}  // namespace pgmutex::postgres_detail
