// pgmutex::Session: many mutexes of one process on one Postgres connection.
//
// A Session owns one connection and one I/O thread, and serves every mutex
// built on it (SessionMutex, blocking; AsioMutex, <pgmutex/asio.hpp>, async):
//   - heartbeats due within one tick go out as one statement (heartbeat_many);
//   - one LISTEN serves every waiter, dispatched by the lock's channel; a
//     waiter sleeps until a release is announced or the holder's row goes
//     stale, never polling; a slow re-check (after a reconnect and every
//     recheck_interval, one statement per table) catches a missed NOTIFY;
//   - each statement keeps its deadline, and each mutex its own lease timer:
//     a hung statement fails every lock waiting on it on time, and one lock's
//     loss never delays another's watchdog.
// This header names neither libpq nor Asio.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <vector>

#include "pgmutex/backend.hpp"
#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/election.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/postgres_backend.hpp"

namespace pgmutex {

struct SessionOptions {
  // The connection: timeouts, reconnects, statement mode (see PostgresOptions).
  PostgresOptions postgres = {};
  // Heartbeats requested within one tick are sent together, in one statement
  // per lock table, at the tick's end: a heartbeat waits at most this long,
  // and never more than half its own heartbeat_timeout (a mutex with a
  // shorter timeout ends the tick sooner, so no beat's deadline passes
  // unsent). Keep it well below the heartbeat_interval of the mutexes.
  std::chrono::nanoseconds heartbeat_tick = std::chrono::milliseconds(100);
  // Every watched lock's table is read again this often (and after each
  // reconnect), in case a NOTIFY was missed. Without LISTEN (unnamed
  // statements, behind a transaction pooler) the tables are read every
  // unnamed_recheck_interval instead.
  std::chrono::nanoseconds recheck_interval = std::chrono::seconds(30);
  std::chrono::nanoseconds unnamed_recheck_interval = std::chrono::seconds(1);
};

// What the session did so far: for tests, benchmarks and metrics.
struct SessionStats {
  std::uint64_t statements = 0;            // statements sent (LISTEN and set-up included)
  std::uint64_t heartbeat_statements = 0;  // heartbeat_many statements sent by the batching
  std::uint64_t heartbeats = 0;            // heartbeats those statements carried
  std::uint64_t notifications = 0;         // NOTIFYs received that woke a waiter
  std::uint64_t rechecks = 0;              // table reads for watched locks
  std::uint64_t connects = 0;              // connections opened
};

class SessionBackend;
namespace postgres_detail {
struct SessionAccess;  // the implementation's (and its tests') way in
}  // namespace postgres_detail

class Session {
 public:
  // Starts the I/O thread; connects on first use (or connect()). The DSN is
  // handed to libpq as PostgresBackend's is. Errc::invalid_argument, naming
  // the option and its rule, for options that cannot work (a tick or an
  // interval that is not positive); the throwing form raises InvalidArgumentError.
  static Result<std::shared_ptr<Session>> create(nothrow_t, std::string dsn, SessionOptions options = {}) noexcept;
  static std::shared_ptr<Session> create(std::string dsn, SessionOptions options = {});

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  // Stops the I/O thread and closes the connection. Mutexes still on it then
  // fail their statements with backend_unavailable.
  ~Session();

  Result<void> connect() noexcept;
  // A Backend for one mutex on this session (SessionMutex's first argument).
  [[nodiscard]] SessionBackend backend();
  [[nodiscard]] SessionStats stats() const noexcept;
  [[nodiscard]] std::string redacted_dsn() const;
  [[nodiscard]] const SessionOptions& options() const noexcept;

  struct Core;  // the I/O thread, the connection and the queues (session.cpp)

 private:
  friend class SessionBackend;
  friend struct postgres_detail::SessionAccess;
  explicit Session(std::shared_ptr<Core> core);
  std::shared_ptr<Core> core_;
  std::weak_ptr<Session> self_;  // for backend(): each SessionBackend keeps the session alive
};

// One mutex's view of a session: the Backend contract (each statement goes
// through the session's connection, serialized with the other mutexes'),
// plus batched asynchronous heartbeats and shared waits. Cheap to make, one
// per mutex; it keeps the session alive.
class SessionBackend {
 public:
  explicit SessionBackend(std::shared_ptr<Session> session);
  SessionBackend(SessionBackend&&) noexcept;
  SessionBackend& operator=(SessionBackend&&) noexcept;
  ~SessionBackend();

  // --- the Backend contract (pgmutex/backend.hpp)
  Result<void> create_schema(std::string_view table) noexcept;
  Result<AcquireResult> try_acquire(const AcquireRequest& request) noexcept;
  Result<void> heartbeat(const HolderKey& key) noexcept;
  Result<void> release(const HolderKey& key) noexcept;
  Result<std::optional<LockRow>> inspect(LockRef lock) noexcept;
  Result<std::vector<LockRow>> list(std::string_view table) noexcept;
  Result<std::optional<LockRow>> force_release(LockRef lock) noexcept;
  // Elections (BackendKeepsElections), each one statement on the session's
  // connection; leader() readings are shared by the callers (observers) of
  // one election that ask before a reading begins.
  Result<LeaderRecord> leader(LockRef lock, std::chrono::nanoseconds stale_threshold) noexcept;
  Result<LeaderRecord> announce(const HolderKey& key, std::string_view value) noexcept;
  Result<LeaderRecord> vacate(const HolderKey& key) noexcept;
  // One statement per transition (BackendElectsInOneStatement).
  Result<AcquireResult> try_acquire(const AcquireRequest& request, GrantAnnouncement& announcement) noexcept;
  Result<void> release_vacating(const HolderKey& key) noexcept;
  // An observer's wait (BackendWaitsForElections): one LISTEN per election
  // on the session's connection, shared by every observer of it there; the
  // changes come in its NOTIFYs, so no statement per change.
  Result<ElectionWake> wait_for_election(LockRef lock, std::chrono::nanoseconds timeout, std::stop_token stop) noexcept;

  // --- optional operations
  Result<std::vector<bool>> heartbeat_many(std::span<const HolderKey> keys) noexcept;
  bool heartbeat_async(const HolderKey& key, BeatCallback done) noexcept;
  Result<bool> wait_until_free(const WatchRequest& watch, std::chrono::nanoseconds timeout,
                               std::stop_token stop) noexcept;
  Result<WatchId> watch_async(const WatchRequest& watch, std::function<void()> woken) noexcept;
  bool cancel_watch(WatchId id) noexcept;
  // The lock's queue (BackendWaitsInQueue): a place bound to the session's
  // connection, LISTENed for on it; a waiter blocks without a statement
  // until the session's I/O thread hands it its turn.
  Result<QueuePlace> enqueue(const AcquireRequest& request, std::chrono::nanoseconds handoff_deadline) noexcept;
  Result<void> dequeue(const AcquireRequest& request, std::int64_t ticket) noexcept;
  Result<QueueWake> wait_in_queue(const WatchRequest& w, std::int64_t ticket, std::chrono::nanoseconds timeout,
                                  std::stop_token stop) noexcept;
  // The same for an async acquire (BackendQueuesAsynchronously): `woken` runs on the session's thread.
  Result<void> wait_in_queue_async(const WatchRequest& w, std::int64_t ticket,
                                   std::function<void(QueueWake)> woken) noexcept;
  bool cancel_queue_wait(LockRef lock, std::int64_t ticket) noexcept;
  // On the session's I/O thread (BackendRunsJobs): the async forms run an
  // operation there, its statements then sent at once.
  bool run_job(std::function<void()> job) noexcept;
  [[nodiscard]] std::uint64_t session() const noexcept;
  [[nodiscard]] std::uint64_t history() const noexcept;
  [[nodiscard]] HeartbeatDurability last_heartbeat_durability() const noexcept;
  [[nodiscard]] bool heartbeat_commits_asynchronously() const noexcept;

  [[nodiscard]] const std::shared_ptr<Session>& owner() const noexcept;
  // Another mutex's view of the same session (BackendShares: a mutex's
  // singleton under a lock name given per call).
  [[nodiscard]] SessionBackend share() const;

 private:
  friend struct postgres_detail::SessionAccess;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A blocking mutex on a session: SessionMutex(session->backend(), options).
extern template class BasicMutex<SessionBackend>;
using SessionMutex = BasicMutex<SessionBackend>;
// An election on a session: SessionElection(session->backend(), options).
extern template class BasicElection<SessionBackend>;
using SessionElection = BasicElection<SessionBackend>;
// An observer on a session: SessionObserver(session->backend(), options).
// Every observer of an election on one session shares one LISTEN there.
extern template class BasicObserver<SessionBackend>;
using SessionObserver = BasicObserver<SessionBackend>;

}  // namespace pgmutex
