// PostgresBackend: the lock table in Postgres. Its own connection is driven
// through libpq's non-blocking API, so every operation ends by its deadline
// (a frozen server included); a borrowed pool connection goes through libpqxx
// (see postgres_pool.hpp for what that cannot bound). This header names
// neither libpqxx nor libpq, so including it costs little compile time; the
// implementation lives in backends/postgres/src.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <vector>

#include "pgmutex/backend.hpp"
#include "pgmutex/error.hpp"

namespace pgmutex {

// How the backend's statements reach the server. A pooler in transaction
// pooling (pgbouncer's pool_mode=transaction) hands each transaction to
// whichever server connection is free, so nothing may outlive one statement
// there: no prepared statement, no LISTEN, no session setting.
enum class StatementMode {
  // `prepared` on a direct connection; `unnamed` when a pooler is in front of
  // the server (its backend key is not the server process's pg_backend_pid(),
  // asked once per connection). The pool mode itself cannot be asked, so
  // pgbouncer in session pooling gets `unnamed` too: say `prepared` there to
  // keep LISTEN. A backend over your own pool (postgres_pool.hpp) is not
  // probed: `automatic` is `prepared` there.
  automatic,
  // Named prepared statements (prepared once per connection), LISTEN/NOTIFY
  // wake-ups, statement_timeout as a session setting. Behind a transaction
  // pooler a statement then fails (SQLSTATE 26000 or 42P05) with an error
  // that names `unnamed`.
  prepared,
  // For a transaction pooler: every statement unnamed (parse, bind, execute in
  // one go; the same text and parameters), every setting local to its own
  // statement's transaction (lock_timeout, synchronous_commit, and
  // statement_timeout, pipelined in front of the statement in the same round
  // trip), heartbeats committed synchronously (the server
  // process may change between two heartbeats unseen, so one cannot vouch
  // for the other), and wait_for_release polls the row with backoff instead
  // of LISTEN.
  unnamed,
};

struct PostgresOptions {
  // How long one host may take to connect (TCP, TLS, login, the
  // target_session_attrs check), unless the DSN sets connect_timeout (or
  // PGCONNECT_TIMEOUT does): then that, read as libpq reads it (whole seconds,
  // at least 2; 0: no limit per host). Per host, as libpq's connect_timeout
  // is: a multi-host DSN (host=a,b port=x,y, or postgresql://a:x,b:y/db) is
  // tried host by host, each with this long of its own, so a first host that
  // never answers costs this much and the next one is tried; all of them
  // together take up to this times the number of hosts (twice that with
  // target_session_attrs=prefer-standby, which tries every host twice).
  // Never past the operation's own deadline: when that is nearer than the
  // budgets of the hosts left, each of them gets an even share of the time
  // left, so the last host is tried too.
  std::chrono::nanoseconds connect_timeout = std::chrono::seconds(5);
  // A statement whose bytes the server does not acknowledge within this time
  // (a partition) fails instead of blocking, and a peer that vanished is found
  // by TCP keepalives about as fast (libpq's tcp_user_timeout and keepalives_*,
  // added to the DSN unless it sets them). Keep it well below the mutex's
  // safety_margin: a heartbeat stuck in the network cannot run the watchdog.
  std::chrono::nanoseconds network_timeout = std::chrono::seconds(10);
  // A lost connection is re-established on the next operation, retrying with
  // exponential backoff from reconnect_backoff, at most reconnect_attempts times.
  int reconnect_attempts = 3;
  std::chrono::nanoseconds reconnect_backoff = std::chrono::milliseconds(100);
  // Heartbeats may skip the WAL flush: losing one costs nothing. Acquires
  // never do, but for a queued waiter's confirm (unflushed_confirm_window).
  bool heartbeat_synchronous_commit_off = true;
  // The bound of an operation whose request names none (timeout 0), and of
  // the LISTEN a wait_for_release sends first. Reconnects are included: the
  // client gives up at the deadline (backend_unavailable, or outcome_unknown
  // for an acquire or release that was sent); the server is told to give up
  // sooner (statement_timeout 3/4 of it, lock_timeout 1/2).
  std::chrono::nanoseconds default_timeout = std::chrono::seconds(10);
  // Stored with each grant for `status` to show (what the holder runs), unless
  // the request names one. The host and pid stored are this process's.
  std::string holder_command = {};
  // See StatementMode.
  StatementMode statement_mode = StatementMode::automatic;
  // After a failover, a promoted standby (a server on a timeline above 1)
  // grants no lock that looks free or stale until it has known its timeline
  // this long: with asynchronous replication a grant the old primary made may
  // be missing here while its holder still believes in it, for up to its
  // stale threshold. A live row's holder keeps its lock meanwhile; others
  // are refused (AcquireResult::failover_grace_left_s, holder
  // "(failover grace)") and a blocking acquire waits. Default (nullopt): the
  // larger of the requester's stale_threshold and the longest stored with a
  // row on the new primary; set it to the longest stale_threshold of any
  // instance if thresholds differ. 0 turns it off: safe with synchronous
  // replication, where no acknowledged grant is lost; with asynchronous
  // replication two holders could then both believe they hold a lock.
  std::optional<std::chrono::nanoseconds> failover_grace = std::nullopt;
  // For a process that exits right after its release, so that the server
  // process's end is not on the next holder's path: called once, with the
  // own connection's socket, when the backend (or a Session) is destroyed
  // with that connection usable, outside a transaction, and neither TLS- nor
  // GSS-encrypted (the server would log a stream cut short). Return true
  // once another process holds a copy of the socket (sent with SCM_RIGHTS):
  // the connection is then closed here without the Terminate message libpq
  // sends, and its server process ends when that copy is closed, with no
  // message in the server's log. Ending takes a Postgres 15 server process
  // about 15 ms of CPU on a two-core Debian 12 machine, as long as the rest
  // of a handoff. `pgmutex run` and `pgmutex elect` hand the socket to their
  // guard process, which closes it 50 ms later. Empty (the default), or
  // false: the server process ends at once, as libpq ends it.
  std::function<bool(int socket)> hand_over_at_close = {};
  // For a process that holds a lock once and exits (pgmutex run): once its
  // own connection queues, the connection plans generically (the session's
  // plan_cache_mode = force_generic_plan) and the waiter has the server plan
  // the confirm and the release while it waits, keeping the plans, so that
  // neither is planned between a release and the next command. On this
  // machine the release's planning on a fresh connection took 1.9 ms (a
  // custom plan, made at each of a connection's first five runs); its kept
  // generic plan 0.2 ms. Off (the default) for a Mutex that lives long: the
  // server's own choice after five runs serves it, and a generic plan of the
  // try runs slower (2.6 ms against 1.0 ms here). Not over a transaction
  // pooler (StatementMode::unnamed), where nothing outlives a statement.
  bool generic_plans_for_handoff = false;
  // A queued waiter that a release offered the lock confirms it in one
  // statement. With at least this long left of the offer (its handoff
  // deadline, counted from the release), that statement commits without
  // waiting for its WAL flush (0.2-0.4 ms of a 0.6 ms handoff on a Debian 12
  // machine with an SSD): a server crash before the flush would take the
  // grant back to the offer, which nobody else may take before the offer's
  // deadline. So the grant is provisional (AcquireResult::provisional_for):
  // the mutex ends its lease before that deadline (by the share of it that the
  // lease is of the stale threshold) and heartbeats at once; a synchronous
  // commit of the same connection shows the grant durable. 1 ms at least.
  // Only on a connection that is the waiter's own server process (not through
  // a pooler) and not a Session's. A campaign's announcement rides on the
  // same commit: observers may hear of a term that a crash then takes back,
  // as after an asynchronous failover (they are told that nobody leads).
  // nullopt: every confirm waits for its flush (`pgmutex run` and `pgmutex
  // elect`: their guard process must have time to stop the command before
  // such a deadline, longer than the default offer). A window shorter than
  // the first heartbeat's round trip would lose leases it just granted.
  std::optional<std::chrono::nanoseconds> unflushed_confirm_window = std::chrono::milliseconds(250);
};

// A source of connections the backend borrows instead of owning one: defined
// in pgmutex/postgres_pool.hpp, the only header of ours that names libpqxx.
class ConnectionSource;

namespace postgres_detail {
struct SharedAccess;
}  // namespace postgres_detail

class PostgresBackend {
 public:
  // Owns one connection, opened on first use from `dsn`, handed to libpq
  // untouched (keyword or URI form; what it leaves out comes from PGHOST,
  // PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE and .pgpass).
  explicit PostgresBackend(std::string dsn = {}, PostgresOptions options = {});

  // Borrows a connection from `pool` for each operation and gives it back; it
  // never opens or closes the pool. Build it with make_pooled_backend(pool)
  // from pgmutex/postgres_pool.hpp.
  explicit PostgresBackend(std::shared_ptr<ConnectionSource> pool, PostgresOptions options = {});

  PostgresBackend(PostgresBackend&&) noexcept;
  PostgresBackend& operator=(PostgresBackend&&) noexcept;
  ~PostgresBackend();

  // Connects now instead of on first use.
  Result<void> connect() noexcept;

  // A backend for another lock of this one's user (BackendShares: a mutex's
  // singleton under a lock name given per call): on the same pool, or the
  // same pgmutex::Session, or, for a backend that owns its connection,
  // another connection from the same DSN and options (opened on first use).
  [[nodiscard]] PostgresBackend share() const;

  // The DSN with any password replaced by "********", fit for logs.
  [[nodiscard]] std::string redacted_dsn() const;

  // --- the Backend contract (pgmutex/backend.hpp)
  Result<void> create_schema(std::string_view table) noexcept;
  Result<AcquireResult> try_acquire(const AcquireRequest& request) noexcept;
  Result<void> heartbeat(const HolderKey& key) noexcept;
  Result<void> release(const HolderKey& key) noexcept;
  Result<std::optional<LockRow>> inspect(LockRef lock) noexcept;
  Result<std::vector<LockRow>> list(std::string_view table) noexcept;
  // Every waiter in the table's queues (BackendListsQueue), for `pgmutex status`.
  Result<std::vector<QueuedWaiterRow>> list_queue(std::string_view table) noexcept;
  Result<std::optional<LockRow>> force_release(LockRef lock) noexcept;

  // --- elections (BackendKeepsElections; election_operations.cpp)
  Result<LeaderRecord> leader(LockRef lock, std::chrono::nanoseconds stale_threshold) noexcept;
  Result<LeaderRecord> announce(const HolderKey& key, std::string_view value) noexcept;
  Result<LeaderRecord> vacate(const HolderKey& key) noexcept;
  // One statement per transition (BackendElectsInOneStatement;
  // backend_operations.cpp): a campaign's try, whose grant announces the
  // value in the same statement, and a resign's release, which vacates the
  // term in the same statement.
  Result<AcquireResult> try_acquire(const AcquireRequest& request, GrantAnnouncement& announcement) noexcept;
  Result<void> release_vacating(const HolderKey& key) noexcept;
  // An observer's wait (BackendWaitsForElections; election_waits.cpp): on
  // its own connection it LISTENs and waits in poll() with no statement;
  // over a pool or a transaction pooler it sleeps 500 ms and says resync.
  Result<ElectionWake> wait_for_election(LockRef lock, std::chrono::nanoseconds timeout,
                                         std::stop_token stop) noexcept;
  // Every lock of the table that has an election row (led now or before),
  // judged live by `stale_threshold` as leader() judges it, for `pgmutex
  // status`. Errc::schema_missing if the table has no election table (one
  // made before elections existed, and create_schema not run since).
  Result<std::vector<ElectionRow>> list_elections(std::string_view table,
                                                  std::chrono::nanoseconds stale_threshold) noexcept;

  // --- optional operations
  Result<bool> wait_for_release(LockRef lock, std::chrono::nanoseconds timeout) noexcept;
  Result<std::vector<bool>> heartbeat_many(std::span<const HolderKey> keys) noexcept;
  // The queue (BackendWaitsInQueue; issue 17): on its own connection the
  // backend LISTENs, then takes a place, and waits in poll() on the socket,
  // making no statement until a release names its ticket. Over a pool, a
  // pgmutex::Session or a transaction pooler it cannot LISTEN: it looks
  // with backoff (25 ms to 1 s), each look a queued try that also keeps
  // its place's lease.
  Result<QueuePlace> enqueue(const AcquireRequest& request, std::chrono::nanoseconds handoff_deadline) noexcept;
  Result<void> dequeue(const AcquireRequest& request, std::int64_t ticket) noexcept;
  Result<QueueWake> wait_in_queue(const WatchRequest& w, std::int64_t ticket, std::chrono::nanoseconds timeout,
                                  std::stop_token stop) noexcept;
  // The server session the last operation ran on: another after a reconnect
  // (our connection) or on another server process (a pool's), so a restart
  // between two heartbeats shows (see BackendReportsSession). Behind a
  // transaction pooler the server process may change under one connection
  // unseen: StatementMode::unnamed commits heartbeats synchronously, so the
  // mutex never needs one heartbeat to vouch for another there.
  [[nodiscard]] std::uint64_t session() const noexcept;
  // The server history the last operation ran on: another after every
  // reconnect (a new server session), whether it reached the same server, a
  // promoted standby after a failover or another cluster: a restart, or a
  // server that closes idle sessions, may have forgotten heartbeats it had
  // acknowledged but not flushed. The first heartbeat after such a change
  // commits synchronously (see BackendReportsHistory), so a lock survives a
  // server that drops every idle connection. Always 0 over a pool: not
  // detected there.
  [[nodiscard]] std::uint64_t history() const noexcept;
  // How the last heartbeat (or heartbeat_many) was committed: synchronously
  // (durable), or asynchronously with the server's WAL end and flush
  // positions read when it began (see BackendReportsDurability).
  [[nodiscard]] HeartbeatDurability last_heartbeat_durability() const noexcept;
  // "<system identifier>/<timeline>" of the server the own connection last
  // reached ("" unknown, or over a pool): for logs and tests.
  [[nodiscard]] std::string server_identity() const;

  // Whether heartbeats commit without waiting for the WAL flush
  // (PostgresOptions::heartbeat_synchronous_commit_off, and not
  // StatementMode::unnamed): a server crash may then forget the last ones,
  // and the mutex keeps more margin. In StatementMode::automatic the answer
  // is final once connected (connect() first).
  [[nodiscard]] bool heartbeat_commits_asynchronously() const noexcept;

  // The NOTIFY channel on which release() announces that `lock` is free:
  // "pgmutex_<table oid>_<hash of the lock name>". It needs the server (the
  // table's oid, so every spelling of the table gives one channel).
  Result<std::string> release_channel(LockRef lock) noexcept;

  // Whether statements go unnamed (StatementMode::unnamed, or automatic
  // behind a pooler): final once connected.
  [[nodiscard]] bool uses_unnamed_statements() const noexcept;

 private:
  struct Impl;
  // A backend whose statements run on a pgmutex::Session's connection, made
  // by the session (internal: see pgmutex/session.hpp).
  friend struct postgres_detail::SharedAccess;
  explicit PostgresBackend(std::unique_ptr<Impl> impl) noexcept;
  static Result<std::vector<bool>> heartbeat_many_of(Impl* impl, std::span<const HolderKey> keys, bool durable,
                                                     bool skip_locked) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pgmutex
