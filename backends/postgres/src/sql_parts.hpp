// The pieces the statement texts are built from, shared by sql.cpp (the
// lock's statements) and queue_sql.cpp (the queue's). Private to the backend.
#pragma once

#include <string>
#include <string_view>

namespace pgmutex::postgres_detail::sql_parts {

// A string literal: a quoted identifier may hold a single quote.
std::string literal(std::string_view text);
// A grant's fence: the sequence's next value plus (timeline - 1) << 40.
std::string fence_value(std::string_view table);
// The table's oid, computed by the server from the quoted name.
std::string oid_of(std::string_view table);
// The key of the advisory lock that serializes the inserts of one lock's
// row ($1 the lock name): a plain try's, a queued try's.
std::string insert_lock_key(std::string_view table);
// The NOTIFY channel, built in SQL exactly as release_channel() builds it.
std::string channel_sql(std::string_view table, std::string_view hash_param);
// "schema"."table_queue", every part quoted.
std::string quoted_queue(std::string_view table);
std::string quoted_election(std::string_view table);
// "schema"."table_fence_seq", every part quoted.
std::string quoted_sequence(std::string_view table);

// The seconds from `column` to now(), never below 0: now() is the
// statement's transaction start, and a heartbeat committed between that and
// its snapshot (stamped with its own, later now()) would read as younger than
// zero.
std::string seconds_since(std::string_view column);

// The timeline WAL is written on now.
extern const std::string_view timeline_value;
// A row is stale once older than the larger of the reclaimer's threshold ($3)
// and the one its holder stored.
extern const std::string_view stale_condition;
// The columns a LockRow is read from, in its order.
extern const std::string& row_columns;  // never destroyed (sql.cpp)
// set_config raising synchronous_commit to on for this statement (a grant must survive a crash).
extern const std::string_view forced_synchronous_commit;

// The failover grace's CTEs (tl, mk, mark, grace: see the acquire in
// sql.cpp), each followed by a comma, for `table` ($3 stale seconds, $9 the
// grace), and the condition that a grace is in force now.
std::string grace_ctes(std::string_view table);
extern const std::string_view in_grace;

// The backend-status snapshot a waiter's liveness is read from (a CTE named
// procs, MATERIALIZED: read once per statement, and only if a queue row is
// looked at), and alive(q): the waiter `q` (a queue row's alias) is alive
// while the backend that queued it is (same pid and start), or, queued
// through a pooler (waiter_pid NULL), while its lease is fresh.
extern const std::string_view procs_cte;
std::string alive(std::string_view q);

}  // namespace pgmutex::postgres_detail::sql_parts

namespace pgmutex::postgres_detail {
struct Statement;
struct TableStatements;
// queue_sql.cpp: the release with handoff (keyed by the holder, or forced),
// the queue's statements, and the queue table's DDL.
// `vacate`: the resign's release (TableStatements::election_release).
Statement handoff_release(std::string_view table, bool keyed, const std::string& name, bool vacate = false);
void add_queue_statements(TableStatements& s, std::string_view table);
std::string create_queue_sql(std::string_view table);
void add_election_statements(TableStatements& s, std::string_view table);
std::string create_election_sql(std::string_view table);
// create_schema's step, before the queue's DDL, that moves the fence
// sequence past the terms an election table kept (a no-op unless it must).
std::string fences_past_terms_sql(std::string_view table);

// What the election adds to a lock statement to make it one of a
// transition's (election_sql.cpp): CTEs for its WITH, and columns (each
// after a comma of its own) for the end of its SELECT list.
struct ElectionParts {
  std::string ctes;
  std::string columns;
};
// A campaign's try: `mine` is a query of the fence of the grant the try
// made or confirmed for itself (no row: none), $1 the lock, $2 the instance,
// $6 the host, `value` and `hash` the parameters of the value and the lock
// hash. The grant's term is announced (e_grant, e_prev, e_up: after a comma
// of the caller's, none after the last); columns: whether the record shows
// it announced now, and the 'elected' NOTIFY.
ElectionParts announce_with_grant(std::string_view table, const std::string& mine, std::string_view value,
                                  std::string_view hash);
// The resign's release: `me` (the holder's locked lock row) names the term
// vacated (e_vac, followed by a comma); column: the 'vacated' NOTIFY.
ElectionParts vacate_with_release(std::string_view table, std::string_view hash);
}  // namespace pgmutex::postgres_detail
