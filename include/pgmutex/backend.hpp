// The backend contract: what a lock table must do, in the types it speaks.
// Every operation is one round trip, noexcept, and returns Result<T>.
// Staleness is always judged on the backend's (server's) clock, never the client's.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <stop_token>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pgmutex/error.hpp"

namespace pgmutex {

using Fence = std::int64_t;

// A random number drawn for each acquire attempt and stored in the row it
// creates. It names one grant: an acquire whose reply was lost is resolved by
// it (never by instance_id, which two objects may share), and heartbeat and
// release match on it. 0 means none: a row made by the seed's package.
using GrantToken = std::uint64_t;

// Which lock: the table it lives in (a validated identifier) and its name.
struct LockRef {
  std::string_view table;
  std::string_view lock_name;
  // Nonzero: the mutex that sends this (never reused within a process).
  // The same nonzero identity always comes with the same table, lock name,
  // instance id and holder details, so a backend may key what it caches on
  // it instead of comparing the strings (MemoryBackend does). 0: unknown.
  std::uint64_t identity = 0;
};

// Which grant: a holder is named by instance, fence and grant token, so a
// stale holder can never touch a row that was since granted to someone else.
struct HolderKey {
  LockRef lock;
  std::string_view instance_id;
  Fence fence = 0;
  GrantToken token = 0;
  // The longest the statement may take, reconnects included; past it the
  // backend gives up with backend_unavailable (or outcome_unknown for a
  // write that may have landed). Zero: the backend's own default.
  std::chrono::nanoseconds timeout{0};
  // A heartbeat only: commit it synchronously, whatever the backend's commit
  // mode (the mutex asks when no asynchronous beat was shown durable for half
  // its lease: a slow WAL writer). Reported as HeartbeatDurability::durable.
  bool durable = false;
};

// Who holds a grant, for an operator's eyes only (never matched on).
struct HolderDetails {
  std::string_view host;     // empty: the backend's default (PostgresBackend: this machine's hostname)
  std::int64_t pid = 0;      // 0: the backend's default (PostgresBackend: this process)
  std::string_view command;  // empty: the backend's default (PostgresBackend: PostgresOptions::holder_command)
};

struct AcquireRequest {
  LockRef lock;
  std::string_view instance_id;
  // A row older than the larger of this and the threshold stored with the
  // holder's grant (server clock) may be taken over. Stored with our grant.
  std::chrono::nanoseconds stale_threshold;
  GrantToken token = 0;  // stored in the row this attempt creates
  std::chrono::nanoseconds timeout{0};  // as in HolderKey
  HolderDetails holder_details{};       // stored with our grant
  // 0: a plain try, which loses to any live waiter in the lock's queue. Else
  // the ticket of this waiter's place in the queue (BackendQueuesWaiters),
  // and `token` is the waiter token it queued with: the try confirms a grant
  // a release offered to that place, or takes a lock that is free, stale or
  // whose offer lapsed if no live waiter is ahead of it.
  std::int64_t queue_ticket = 0;
};

// The outcome of one try. A losing try is not an error: it names the holder.
struct AcquireResult {
  bool acquired = false;
  Fence fence = 0;            // ours if acquired, else the holder's
  std::string holder;         // lost: who holds it; won by takeover: the previous holder
  double holder_age_s = 0.0;  // lost: holder's seconds since heartbeat; takeover: previous holder's
  bool reclaimed = false;     // won by taking over a stale row
  // lost: the holder's grant token (0 for a seed-made row, and for a grant a
  // release offered to a queued waiter that has not confirmed it yet: only
  // that waiter's queued try may take it, never an adopting plain try)
  GrantToken holder_token = 0;
  // Lost because the server was promoted after a failover and grants nothing
  // that looks free or stale for this many more seconds (the failover grace:
  // a grant the old primary made and the new one never received may still
  // be held). holder is then failover_grace_holder, fence and age 0.
  double failover_grace_left_s = 0.0;
  // A queued try (queue_ticket != 0) lost because the waiter's place is gone:
  // its offer lapsed and passed on, or it was swept as dead after a
  // reconnect. It must enqueue again, at the back.
  bool queue_place_lost = false;
  // Acquired, but not yet durable (0: durable, as every grant but this
  // one): a queued waiter's confirm that committed without waiting for its
  // WAL flush. A server crash before that flush takes the grant back to the
  // offer the release made durably, which nobody else may take before this
  // long after the statement was sent. The mutex counts the lease from the
  // send as usual but ends it before that (the share of it its lease is of
  // its stale threshold: the same margin against clock drift), and
  // heartbeats at once: a synchronous commit in the same server session (its
  // flush passes this one's) makes the grant durable, and the whole lease applies.
  std::chrono::nanoseconds provisional_for{0};
};

// The holder an acquire refused by a failover grace names. An instance could
// be called that too: failover_grace_left_s > 0 is what tells.
inline constexpr std::string_view failover_grace_holder = "(failover grace)";

// One row of the lock table, as an administrator sees it.
struct LockRow {
  std::string lock_name;
  std::string instance_id;
  Fence fence = 0;
  std::chrono::system_clock::time_point acquired_at;  // server clock
  double seconds_since_heartbeat = 0.0;               // server clock, computed in the statement
  GrantToken token = 0;                               // 0: a row made by the seed's package
  std::chrono::nanoseconds stale_threshold{0};        // the holder's; 0: not stored (a seed-made row)
  // Where the holder runs, as its grant recorded it; empty or 0: not recorded
  // (a seed-made row, or a holder that did not say).
  std::string holder_host;
  std::int64_t holder_pid = 0;
  std::string holder_command;
};

// --- The required operations, one small concept each, so that a backend
// missing one fails with the name of what is missing.

template <class B>
concept BackendCreatesSchema = requires(B& b, std::string_view table) {
  { b.create_schema(table) } noexcept -> std::same_as<Result<void>>;
};

template <class B>
concept BackendTriesAcquire = requires(B& b, const AcquireRequest& request) {
  { b.try_acquire(request) } noexcept -> std::same_as<Result<AcquireResult>>;
};

// Errc::lock_not_held when no row matches (row gone, or another fence).
template <class B>
concept BackendHeartbeats = requires(B& b, const HolderKey& key) {
  { b.heartbeat(key) } noexcept -> std::same_as<Result<void>>;
};

// Errc::lock_not_held when no row matches.
template <class B>
concept BackendReleases = requires(B& b, const HolderKey& key) {
  { b.release(key) } noexcept -> std::same_as<Result<void>>;
};

template <class B>
concept BackendInspects = requires(B& b, LockRef lock, std::string_view table) {
  { b.inspect(lock) } noexcept -> std::same_as<Result<std::optional<LockRow>>>;
  { b.list(table) } noexcept -> std::same_as<Result<std::vector<LockRow>>>;
};

// An administrator removes a lock whoever holds it; returns the removed row.
template <class B>
concept BackendForceReleases = requires(B& b, LockRef lock) {
  { b.force_release(lock) } noexcept -> std::same_as<Result<std::optional<LockRow>>>;
};

template <class B>
concept Backend = std::movable<B> && BackendCreatesSchema<B> && BackendTriesAcquire<B> &&
                  BackendHeartbeats<B> && BackendReleases<B> && BackendInspects<B> &&
                  BackendForceReleases<B>;

// --- Optional operations: used when present, never required.

// Block until the lock is released (true) or the timeout passes (false).
// Postgres does it with LISTEN/NOTIFY; without it, a waiter polls.
template <class B>
concept BackendWaitsForRelease =
    requires(B& b, LockRef lock, std::chrono::nanoseconds timeout) {
      { b.wait_for_release(lock, timeout) } noexcept -> std::same_as<Result<bool>>;
    };

// Whether a heartbeat the backend acknowledged can still be lost (Postgres with
// synchronous_commit off: a server crash forgets the last commits). The mutex
// then keeps a heartbeat interval more of margin, and counts the lease from
// a heartbeat only once it is known durable (BackendReportsDurability).
// Absent: false, and every heartbeat the backend acknowledges must be durable
// (PostgresBackend forces synchronous_commit on for it, whatever the server,
// the role or the database says).
template <class B>
concept BackendReportsCommitMode = requires(const B& b) {
  { b.heartbeat_commits_asynchronously() } noexcept -> std::same_as<bool>;
};

// The server session the last operation ran on, as a number that changes
// when the session does (a reconnect, another server process). Where
// heartbeats commit asynchronously, a heartbeat counts as durable only once a
// later answer of the same session shows it flushed: a server restart in
// between may have forgotten it. Absent: every operation is taken to run in one session.
template <class B>
concept BackendReportsSession = requires(const B& b) {
  { b.session() } noexcept -> std::same_as<std::uint64_t>;
};

// The server history the last operation ran on, as a number that changes
// when the server's history may have diverged from what earlier operations
// saw: a failover to a promoted standby (Postgres: a new timeline), another
// cluster (another system identifier). Commits the earlier server
// acknowledged, durable ones included, may be missing there (asynchronous
// replication), so a heartbeat acknowledged before the change proves nothing
// after it. The contract: the first heartbeat a backend acknowledges in a
// new history is durable there (committed synchronously), so that the mutex
// counts the lease from it alone. Absent: the history never changes.
template <class B>
concept BackendReportsHistory = requires(const B& b) {
  { b.history() } noexcept -> std::same_as<std::uint64_t>;
};

// How the server committed the last heartbeat, where heartbeats commit
// asynchronously (BackendReportsCommitMode): whether this one was committed
// synchronously anyway (durable: the first after a reconnect or a failover),
// and two positions in the server's write-ahead log read when the statement
// began, before it wrote anything: where the log ended (wal_before: past the
// commit of everything this backend's answers acknowledged before it was
// sent) and how far it was flushed to disk (wal_flushed). 0: not told. The
// mutex trusts an asynchronous heartbeat only once a later answer's
// wal_flushed reaches a wal_before read after its commit: never because time
// passed (a server's WAL writer may be slow, and a crash forgets what it
// had not flushed).
struct HeartbeatDurability {
  bool durable = false;
  std::uint64_t wal_before = 0;
  std::uint64_t wal_flushed = 0;
};

// The HeartbeatDurability of the last heartbeat (or heartbeat_many).
// Absent: no heartbeat is known durable but through a new server history,
// and an asynchronous one is never trusted (only the acquire and the
// history's first heartbeat are).
template <class B>
concept BackendReportsDurability = requires(const B& b) {
  { b.last_heartbeat_durability() } noexcept -> std::same_as<HeartbeatDurability>;
};

// Heartbeat many grants in one statement; element i is false if key i is no longer held.
template <class B>
concept BackendBatchesHeartbeats = requires(B& b, std::span<const HolderKey> keys) {
  { b.heartbeat_many(keys) } noexcept -> std::same_as<Result<std::vector<bool>>>;
};

// --- Sessions: many mutexes of one process on one connection (pgmutex::Session).

// What a heartbeat sent with heartbeat_async came to: the answer
// (Errc::lock_not_held if the row is no longer ours), the server session
// and history it ran on (see BackendReportsSession and BackendReportsHistory;
// 0 where the backend does not tell), and how it was committed
// (see BackendReportsDurability).
struct BeatReply {
  Result<void> result;
  std::uint64_t session = 0;
  std::uint64_t history = 0;
  HeartbeatDurability durability{};
};
using BeatCallback = std::function<void(BeatReply)>;

// A heartbeat that does not block the caller: the backend may hold it for a
// short while to send it with others in one statement. `done` runs exactly
// once, later, on a thread of the backend's (never inside this call), and must
// not block: the mutex only notes the answer there. False: not taken (no
// memory, a moved-from backend), and `done` never runs. The backend copies
// what it keeps of `key` (its views die with the call). With it, the mutex's
// wake-up sends the automatic heartbeat without a thread of the executor.
template <class B>
concept BackendBeatsAsynchronously = requires(B& b, const HolderKey& key, BeatCallback done) {
  { b.heartbeat_async(key, std::move(done)) } noexcept -> std::same_as<bool>;
};

// What a waiter knows of the lock it waits for.
struct WatchRequest {
  LockRef lock;
  // The waiter's: a row is stale past the larger of this and the threshold
  // stored with the holder's grant.
  std::chrono::nanoseconds stale_threshold{0};
  // When the holder's row goes stale as the waiter's last try saw it
  // (threshold minus the holder's age); unknown: nullopt.
  std::optional<std::chrono::nanoseconds> holder_stale_in = std::nullopt;
};

// When a waiter's watch should look at the holder again (holder_stale_in),
// from the waiter's stale threshold and the holder's age as its refused try
// saw them: once the row passes that threshold. A row already past it that
// the try still refused is held under a longer threshold its holder stored
// (a frozen holder with a longer lease), or is the line's: looking again at
// once would spin (measured: 1,500 statements a second from one waiter), so
// the watch looks again one threshold later.
[[nodiscard]] inline std::chrono::nanoseconds holder_stale_look_in(std::chrono::nanoseconds threshold,
                                                                   std::chrono::nanoseconds age) noexcept {
  const std::chrono::nanoseconds left = threshold - age;
  return left > std::chrono::nanoseconds::zero() ? left : threshold;
}

// Block until the lock may be free: a release announced (NOTIFY), the
// holder's stale deadline reached, or a re-check found the row gone or stale
// (true); `timeout` passed or `stop` requested (false). The backend shares
// one way of hearing about releases between all its waiters, so a waiter
// costs no statement while it waits; the mutex then waits with it instead of
// polling every poll_interval.
template <class B>
concept BackendWatchesLocks =
    requires(B& b, const WatchRequest& w, std::chrono::nanoseconds timeout, std::stop_token stop) {
      { b.wait_until_free(w, timeout, stop) } noexcept -> std::same_as<Result<bool>>;
    };

// The same without blocking: `woken` runs once, on a thread of the backend's,
// when the lock may be free (as wait_until_free returns true); it must not
// block. cancel_watch: true if `woken` had not started and never will; false
// if it ran or is running.
using WatchId = std::uint64_t;
template <class B>
concept BackendWatchesLocksAsynchronously =
    requires(B& b, const WatchRequest& w, std::function<void()> woken, WatchId id) {
      { b.watch_async(w, std::move(woken)) } noexcept -> std::same_as<Result<WatchId>>;
      { b.cancel_watch(id) } noexcept -> std::same_as<bool>;
    };

// --- Running work on the backend's thread, and sharing it.

// Runs `job` on the backend's own I/O thread, where the backend's blocking
// operations run at once, without handing each statement to that thread and
// waiting for it; false if it cannot (stopped). A job may also be destroyed
// unrun (refused, or the backend stopped before its turn): it must then hand
// its work elsewhere from its destructor, as the async forms' jobs do (to the
// I/O pool). The async forms use it to save two thread hand-offs per operation. A
// job runs ahead of the backend's other work (heartbeats, watches), so it
// must not wait for anything but the backend's own statements: never
// wait_until_free, never a lock that a thread waiting for the backend may
// hold, never a user callback that may block.
template <class B>
concept BackendRunsJobs = requires(B& b, std::function<void()> job) {
  { b.run_job(std::move(job)) } noexcept -> std::same_as<bool>;
};

// Another backend of the same kind, for another lock of this one's user (a
// mutex's singleton under a lock name given per call): on the same pool or
// session, or, for a backend that owns its connection, another connection
// from the same settings. A copyable backend needs none: its copy is one.
template <class B>
concept BackendShares = requires(const B& b) {
  { b.share() } -> std::same_as<B>;
};

}  // namespace pgmutex

// The queue's part of the contract, in its own file (it needs the types above).
#include "pgmutex/backend_queue.hpp"  // IWYU pragma: export
// The election's part, likewise.
#include "pgmutex/backend_election.hpp"  // IWYU pragma: export
