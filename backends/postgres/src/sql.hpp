// The SQL the backend sends: every statement for one table, built once, with
// the table name quoted and every value a bound parameter. Private to the backend.
#pragma once

#include <string>
#include <string_view>

#include "pgmutex/table_name.hpp"

namespace pgmutex::postgres_detail {

// A prepared statement: its name and its text. The name is `name_prefix`
// (what the statement does) and a 64-bit hash of the text, which names the
// table: a server session behind a pooler may hold an older pgmutex's
// statement under an older name, and a text (or its result columns, which
// are in the text) that changes gets a new name by itself, with no version
// tag to bump. Two statements share a name only if they share the text.
// At most 63 bytes (Postgres's identifier limit): a longer name would be
// truncated by the server, and two statements could meet under one name.
struct Statement {
  Statement() = default;
  Statement(std::string_view name_prefix, std::string text);
  std::string name;
  std::string sql;
};

// Parameters named "lock_timeout" are milliseconds as text, set with
// set_config(..., true) inside the statement, before any row lock is waited for.
// "token" is the grant token bit-cast to int64 (0: none, stored as NULL).
struct TableStatements {
  std::string table;  // as the user wrote it (validated)
  bool asynchronous = false;  // heartbeats commit asynchronously and return the WAL positions
  // $1 lock_name, $2 instance_id, $3 stale seconds (float8), $4 token, $5 lock_timeout, $6 host, $7 pid,
  // $8 command, $9 failover grace seconds (float8; 0 off, negative: the default).
  // Returns: ins fence, upd fence, the row seen (instance_id, fence, age,
  // token, stale), the failover grace's seconds left (NULL: none; > 0: in grace).
  Statement acquire;
  Statement heartbeat;       // $1 lock_name, $2 instance_id, $3 fence, $4 token, $5 lock_timeout
                             // asynchronous: returns wal_before, wal_flushed (bytes; see BackendReportsDurability)
  Statement release;         // $1 lock_name, $2 instance_id, $3 fence, $4 token, $5 lock hash, $6 lock_timeout
  Statement inspect;         // $1 lock_name
  Statement list;            // no parameters
  Statement force_release;   // $1 lock_name, $2 lock hash, $3 lock_timeout
  Statement heartbeat_many;  // $1 lock_name[], $2 instance_id[], $3 fence[], $4 token[], $5 lock_timeout
  // As heartbeat_many, but a row another transaction has locked is skipped
  // (not returned) instead of waited for: a session's batch goes on for every
  // other lock, and sends the skipped keys again on their own.
  Statement heartbeat_many_skip_locked;
  Statement heartbeat_durable;  // as heartbeat, always committed synchronously (the first after a failover)

  // --- the queue (issue 17; queue_sql.cpp). A release hands the lock to the
  // first live waiter in place (an offer) and NOTIFYs 'o:<fence>:<head
  // ticket>:<runner-up ticket or 0>:<the head's handoff deadline, ms>'; ''
  // when the row went and nobody waits.
  // The plain acquire above loses to any live waiter and to an unlapsed offer.
  // A queued try: the acquire's $1..$9, then $10 ticket, $11 the backend pid
  // the connection reported at start-up (0: none), $12 lock hash. Confirms an
  // offer carrying $4, or reports the place lost, or (the lock available)
  // gives it to the first live waiter: us, or an offer to that head.
  // Returns (by index): 0 the fence confirmed, 1 the fence taken, 2 lost,
  // 3..7 the row seen (instance, fence, age, token, stale), 8 grace seconds
  // left, 9 the fence offered, 10 its head's instance, 11 the NOTIFYs sent,
  // 12 rows changed, 13 the runner-up that offer named, 14 the head's
  // handoff deadline (ms); with no offer made but one standing and us the
  // first live waiter behind it, 13 our ticket and 14 the ms it may still stand.
  Statement acquire_queued;
  // The same try when the waiter heard a release offer it the lock: $1 lock,
  // $2 instance, $3 waiter token, $4 ticket, $5 lock timeout, $6 host. Only
  // the queued try's first branch (confirm the offer carrying $3), so that a
  // handoff's second statement is a small one, quick to plan on a fresh
  // connection; returns the fence confirmed (NULL: the offer is not ours any
  // more, and the queued try decides) and the rows it changed.
  Statement confirm_offer;
  // $1 lock, $2 instance, $3 stale seconds, $4 waiter token, $5 handoff
  // seconds, $6 lease seconds (a pooled waiter's), $7 reported backend pid,
  // $8 host, $9 pid, $10 command. Returns ticket, ahead, try_now, pid_bound,
  // and the ms a standing offer it joins as runner-up may still stand.
  Statement enqueue;
  // $1 lock, $2 ticket, $3 waiter token, $4 lock hash. Returns dequeued,
  // offered_fence, the NOTIFYs sent (a leaving runner-up's), and whether
  // it may have missed an offer that makes it one (then: hand_on).
  Statement dequeue;
  // The dequeue's naming of the next waiter alone, on a fresh snapshot:
  // $1 lock, $2 the ticket that went, $3 its token (only typed), $4 lock hash.
  Statement hand_on;
  // No parameters. Every waiter: lock, ticket, instance, host, pid, seconds
  // waiting, offered, alive; by lock, then in queue order.
  Statement list_queue;

  // --- the election (issue 18; election_sql.cpp). The leader is the lock's
  // holder; its announcements are keyed by its grant as a heartbeat is.
  // $1 lock, $2 the reader's stale seconds. Returns the election row (or
  // NULLs), the lock row's fence (0: none), its age, whether it is live.
  Statement leader;
  // $1..$5 a heartbeat's key and lock_timeout, $6 value, $7 lock hash.
  // Returns whether the key held the lock, then the election row as it is now.
  Statement announce;
  // $1..$5 as announce, $6 lock hash. Returns as announce.
  Statement vacate;
  // $1 the reader's stale seconds. Every election row of the table: its
  // lock_name, then the columns leader returns; by lock.
  Statement list_elections;
  // One statement per transition (BackendElectsInOneStatement). A
  // campaign's tries: acquire's $1..$9, $10 the value, $11 the lock hash;
  // acquire_queued's $1..$12, $13 the value. Each returns what the plain one
  // returns (acquire_queued's 0..14), then whether the election row now shows the try's own grant
  // announced, then the 'elected' NOTIFY (void). A grant the try makes or
  // confirms for itself announces the value in the same transaction.
  Statement election_acquire;
  Statement election_acquire_queued;
  // confirm_offer's $1..$6, $7 the lock hash, $8 the value: the confirm
  // announces the value in the same transaction (then announced, the NOTIFY).
  Statement election_confirm_offer;
  // The resign: release's parameters and answer, the holder's term vacated
  // in the same transaction (then the 'vacated' NOTIFY, void).
  Statement election_release;
};

// The failover grace's marker row: lock_name '' (validate_lock_name allows
// no lock to be called that), this instance_id, fence = the timeline it was
// written on, acquired_at = when that timeline was first seen. Never shown
// or touched as a lock (inspect, list, release, force_release skip it).
inline constexpr std::string_view failover_grace_marker = "(failover grace)";

// `table` must have passed validate_table_name.
TableStatements make_statements(std::string_view table, bool heartbeat_synchronous_commit_off);

// "schema"."table" or "table": every part quoted, as psql's rules read it.
std::string quote_table(std::string_view table);

// The table as a user would type it in a GRANT (sql_name in
// pgmutex/table_name.hpp), and its fence sequence likewise.
std::string sql_table(std::string_view table);
std::string sql_fence_sequence(std::string_view table);
// The queue of waiters next to the table: mutex_lock -> mutex_lock_queue.
std::string sql_queue_table(std::string_view table);
// The announced leaders next to the table: mutex_lock -> mutex_lock_election.
std::string sql_election_table(std::string_view table);

// create_schema's whole work, one multi-statement string that the server runs
// as one implicit transaction: serialized by an advisory lock, it creates the
// seed's table plus fence, and adds to an existing table (say, one made by the
// seed's DDL) the columns it lacks. Nothing is spliced but the validated name.
std::string create_schema_sql(std::string_view table);

// Resolves a quoted table name ($1) to its oid, the lock's identity in Postgres:
// `t` and `public.t` are one table, so they share advisory keys and channels.
inline constexpr std::string_view table_oid_sql = "SELECT $1::regclass::oid::bigint";

// The hash of a lock name that, with the table's oid, makes its NOTIFY channel.
std::string lock_hash(std::string_view lock_name);

// The NOTIFY channel of one lock: "pgmutex_<table oid>_<lock hash>", an
// identifier whatever the lock name. The statements build the same text.
std::string release_channel(std::string_view table_oid, std::string_view lock_name);
// A queued waiter's own channel on its connection, as notify_offer() builds
// it in SQL: the lock's channel, '_', the waiter's backend pid.
std::string own_channel(const std::string& lock_channel, int backend_pid);
// Where a release that left the lock free (offered to nobody) says so, for
// the waiters on their own channels: the lock's channel, '_v'.
std::string vacancy_channel(const std::string& lock_channel);

// 64-bit FNV-1a, as 16 hex digits.
std::string hash_hex(std::string_view text);

}  // namespace pgmutex::postgres_detail
