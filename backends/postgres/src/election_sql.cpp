// The text of the election's statements (issue 18): the table of announced leaders next to the lock table, who leads
// (one read), an announcement (elected, or a proclaim within the term) and a
// vacate, and the parts that the campaign's acquire and the resign's release
// add to the lock's and the queue's statements (one statement per
// transition). The term is the lock grant's fence; the leader is the lock's
// holder, so every write is keyed by the holder's grant exactly as a
// heartbeat is (or made by the statement that grants it), and locks the lock
// row before the election row (queue_sql.cpp's lock order). Observers are
// told on the lock's channel plus "_e".
#include <string>

#include "pgmutex/backend.hpp"
#include "pgmutex/table_name.hpp"
#include "sql.hpp"
#include "sql_parts.hpp"

namespace pgmutex::postgres_detail {

using namespace sql_parts;

namespace {

// The holder's own lock row, locked: the key of a heartbeat ($1 lock, $2
// instance, $3 fence, $4 token), after cfg set the lock timeout ($5).
// `live`: and not stale by its holder's own threshold (an announce: a
// leader whose lease ran out announces nothing, even if nobody took over).
std::string holder_row(const std::string& t, bool live) {
  return " me AS (SELECT t.fence, t.instance_id, t.holder_host FROM " + t + " AS t, cfg WHERE t.locked = 1"
         " AND t.lock_name = $1 AND t.instance_id = $2 AND t.fence = $3 AND coalesce(t.grant_token, 0) = $4::bigint" +
         std::string(live ? " AND t.last_heartbeat >= now() - coalesce(t.holder_stale_s, 0) * interval '1 second'" : "") +
         " FOR UPDATE OF t),";
}

// An election row's columns (of `row`), as election_operations.cpp's read_record reads them.
std::string record_columns(const std::string& row) {
  const std::string r = row + ".";
  return r + "term, " + r + "change_no, " + r + "announced, " + r + "leader_value, " + r + "instance_id, coalesce(" + r +
         "holder_host, ''), (extract(epoch FROM " + r + "since) * 1000000)::bigint";
}

// The lock row `t` as an election read sees it, after the election row:
// its fence (0: none), its heartbeat's age, and whether it is live for the
// reader's stale threshold (`stale`, seconds) or the holder's, whichever is
// larger, and that threshold.
std::string lock_row_columns(std::string_view stale) {
  return "coalesce(t.fence, 0), coalesce(" + seconds_since("t.last_heartbeat") +
         ", 0), coalesce(t.last_heartbeat >= now() - greatest(" + std::string(stale) +
         "::float8, coalesce(t.holder_stale_s, 0)) * interval '1 second', false), greatest(" + std::string(stale) +
         "::float8, coalesce(t.holder_stale_s, 0))";
}

// What observers are told ($h: the lock hash), the whole change so that they
// need no statement: 'e:<kind>:<change>:<term>:<since µs>:<n>:<instance><m>:<host><value>',
// n and m the byte lengths of what follows them; the value last, so it may
// hold anything (election_rules.hpp parses it).
std::string notify(std::string_view table, std::string_view hash, std::string_view kind, std::string_view row) {
  const std::string r = std::string(row) + ".";
  return "pg_notify(" + channel_sql(table, hash) + " || '_e', 'e:' || " + std::string(kind) + " || ':' || " + r +
         "change_no || ':' || " + r + "term || ':' || (extract(epoch FROM " + r + "since) * 1000000)::bigint || ':' || "
         "octet_length(" + r + "instance_id) || ':' || " + r + "instance_id || octet_length(coalesce(" + r +
         "holder_host, '')) || ':' || coalesce(" + r + "holder_host, '') || " + r + "leader_value)";
}

// The upsert of an announcement: the election row of $1 gets term
// `fence`, `value`, `instance`, `host` (SQL expressions over `from`). A
// higher term is elected; the same term, announced, with another value is
// proclaimed; anything else (the same value again, a vacated term, a lower
// term) writes nothing. Returns the row written.
std::string upsert_announcement(const std::string& e, std::string_view fence, std::string_view value,
                                std::string_view instance, std::string_view host, std::string_view from) {
  return "INSERT INTO " + e + " AS e (lock_name, term, change_no, announced, leader_value, instance_id,"
         " holder_host, since, changed_at)"
         " SELECT $1, " + std::string(fence) + ", 1, true, " + std::string(value) + "::text, " + std::string(instance) +
         ", " + std::string(host) + ", now(), now() FROM " + std::string(from) +
         " ON CONFLICT (lock_name) DO UPDATE SET term = excluded.term, change_no = e.change_no + 1, announced = true,"
         " leader_value = excluded.leader_value, instance_id = excluded.instance_id, holder_host = excluded.holder_host,"
         " since = CASE WHEN e.term = excluded.term THEN e.since ELSE now() END, changed_at = now()"
         " WHERE e.term < excluded.term OR (e.term = excluded.term AND e.announced"
         " AND e.leader_value IS DISTINCT FROM excluded.leader_value)"
         " RETURNING e.*";
}

// The holder's term vacated: the row stays, not leading, and the count moves
// on; only if `me` (the holder's locked lock row) names its term and it is
// announced. Returns the row written.
std::string vacate_term(const std::string& e) {
  return "UPDATE " + e + " AS e SET announced = false, change_no = e.change_no + 1, changed_at = now()"
         " FROM me WHERE e.lock_name = $1 AND e.term = me.fence AND e.announced RETURNING e.*";
}

}  // namespace

ElectionParts announce_with_grant(std::string_view table, const std::string& mine, std::string_view value,
                                  std::string_view hash) {
  const std::string e = quoted_election(table);
  ElectionParts out;
  out.ctes = " e_grant AS (" + mine + "),"
             " e_prev AS (SELECT term, announced FROM " + e + " WHERE lock_name = $1),"
             " e_up AS (" + upsert_announcement(e, "g.fence", value, "$2", "nullif($6::text, '')", "e_grant AS g") + ")";
  // Announced: written now, or (a confirm tried again after its reply was
  // lost) written by the first, as this statement's snapshot shows it.
  out.columns = ", EXISTS (SELECT 1 FROM e_up) OR coalesce((SELECT p.term = g.fence AND p.announced"
                " FROM e_prev AS p, e_grant AS g), false),"
                " (SELECT " + notify(table, hash, "CASE WHEN (SELECT term FROM e_prev) = a.term THEN 'p' ELSE 'l' END", "a") +
                " FROM e_up AS a)";
  return out;
}

ElectionParts vacate_with_release(std::string_view table, std::string_view hash) {
  ElectionParts out;
  out.ctes = " e_vac AS (" + vacate_term(quoted_election(table)) + "),";
  out.columns = ", (SELECT " + notify(table, hash, "'v'", "v") + " FROM e_vac AS v)";
  return out;
}

std::string sql_election_table(std::string_view table) {
  const TableName parts = parse_table_name(table).value();
  return sql_name(TableName{parts.schema, derived_identifier("", parts.name, "_election")});
}

// One row per lock that was ever led, kept while nobody leads, so that
// change_no counts every announcement of the lock without a gap (observers
// compare counts, never terms: fences are not contiguous). The value's bound
// keeps it, with the header, inside one NOTIFY (8000 bytes).
std::string create_election_sql(std::string_view table) {
  const TableName parts = parse_table_name(table).value();
  const std::string pkey = sql_identifier(derived_identifier("", parts.name, "_election_pkey"));
  return "CREATE TABLE IF NOT EXISTS " + quoted_election(table) + " (\n"
         "  lock_name      VARCHAR(64) NOT NULL,\n"
         "  term           BIGINT NOT NULL,\n"
         "  change_no      BIGINT NOT NULL,\n"
         "  announced      BOOLEAN NOT NULL,\n"
         "  leader_value   TEXT NOT NULL CHECK (octet_length(leader_value) <= " +
         std::to_string(max_election_value_bytes) + "),\n"
         "  instance_id    VARCHAR(64) NOT NULL,\n"
         "  holder_host    TEXT,\n"
         "  since          TIMESTAMPTZ NOT NULL,\n"
         "  changed_at     TIMESTAMPTZ NOT NULL,\n"
         "  CONSTRAINT " + pkey + " PRIMARY KEY (lock_name)\n"
         ") WITH (fillfactor = 50);\n";
}

// A term is the fence of the grant that announced it, and a fence is the
// sequence's next value plus (timeline - 1) << 40 (sql.cpp's fence_value).
// The election table does not depend on the lock table: dropping the lock
// table and its sequence and making them again restarts fences below the
// terms it kept, and every announce would then be refused (the record's term
// is higher: term_refused) while the candidates take turns at the lock. So
// create_schema moves the sequence to max(term) - (timeline_now - 1) << 40:
// the next fence, that value plus one plus the same offset, is max(term) + 1.
// A term of an earlier timeline asks for nothing (the value it needs is
// below the sequence's); one of a later timeline than now (an election table restored
// into a new cluster) puts the sequence above 2^40, which is harmless: what
// keeps a promoted standby's fences above the old primary's is that its
// sequence lags by less than 2^40, not the sequence's size.
//
// setval is not nextval: a grant taking a value between the read and the
// setval would see the sequence move back under it, and a fence be granted
// twice. Every nextval of the sequence is made by a statement writing the
// lock table, so the move happens under LOCK TABLE ... SHARE ROW EXCLUSIVE
// (which every writer's ROW EXCLUSIVE waits for) and is read again there. It
// is taken only when a move is due: a create_schema of a healthy schema stalls
// no heartbeat. It runs before the queue's DDL (create_schema_sql): an
// upgrade there locks the queue table, which a grant holding the lock table
// may be waiting for. A role that may not read the election table or the sequence
// skips the step (an announce then names the repair); one that may read but
// may not setval is refused with the statement its owner can run.
std::string fences_past_terms_sql(std::string_view table) {
  const std::string t = quote_table(table);
  const std::string e = literal(quoted_election(table));
  const std::string seq = literal(quoted_sequence(table));
  const std::string needed_sql =
      "(SELECT max(term) FROM " + quoted_election(table) + ") - ((" + std::string(timeline_value) + " - 1) << 40)";
  const std::string last = "coalesce(pg_sequence_last_value(" + seq + "), 0)";
  return "DO $pgmutex$ DECLARE needed bigint; BEGIN\n"
         "  IF to_regclass(" + e + ") IS NULL OR NOT has_table_privilege(" + e + ", 'SELECT')\n"
         "     OR NOT has_sequence_privilege(" + seq + ", 'SELECT, USAGE') THEN RETURN; END IF;\n"
         "  needed := " + needed_sql + ";\n"
         "  IF needed IS NULL OR needed <= " + last + " THEN RETURN; END IF;\n"
         "  IF NOT has_sequence_privilege(" + seq + ", 'UPDATE') THEN\n"
         "    RAISE EXCEPTION 'the election table % records terms above the fences its sequence % hands out', " + e +
         ", " + seq + "\n"
         "      USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'the sequence was reset (the lock"
         " table and its sequence dropped and made again?); have the owner of the sequence run create_schema()"
         " (pgmutex schema), or run: SELECT setval(' || quote_literal(" + seq + ") || ', ' || needed || ')';\n"
         "  END IF;\n"
         "  LOCK TABLE " + t + " IN SHARE ROW EXCLUSIVE MODE;\n"
         "  needed := " + needed_sql + ";\n"
         "  IF needed > " + last + " THEN PERFORM setval(" + seq + ", needed); END IF;\n"
         "END $pgmutex$;\n";
}

void add_election_statements(TableStatements& s, std::string_view table) {
  const std::string t = quote_table(table);
  const std::string e = quoted_election(table);

  // Who leads: $1 lock, $2 the reader's stale threshold (seconds). Leading:
  // announced, not vacated, and the lock row live under the same fence.
  s.leader = {"pgmutex_leader",
              "SELECT " + record_columns("e") + ", " + lock_row_columns("$2") +
                  " FROM (VALUES (1)) AS one(x) LEFT JOIN " + e + " AS e ON e.lock_name = $1"
                  " LEFT JOIN " + t + " AS t ON t.locked = 1 AND t.lock_name = $1"};

  // S: every election of the table for `pgmutex status` ($1 the reader's
  // stale threshold), each row as leader's, its lock's name first.
  s.list_elections = {"pgmutex_list_elections",
                      "SELECT e.lock_name, " + record_columns("e") + ", " + lock_row_columns("$1") + " FROM " + e +
                          " AS e LEFT JOIN " + t + " AS t ON t.locked = 1 AND t.lock_name = e.lock_name"
                          " ORDER BY e.lock_name"};

  // An announcement by the holder of the lock ($1..$5 a heartbeat's key and
  // lock timeout, $6 the value, $7 the lock hash): a new term is elected, the
  // same term with another value proclaimed; the same value again, or a term
  // already vacated, writes nothing (a retry after a lost reply is harmless).
  // Returns whether the key held the lock, then the row as it is now.
  s.announce = {
      "pgmutex_announce",
      "WITH cfg AS (SELECT " + std::string(forced_synchronous_commit) + ", set_config('lock_timeout', $5, true)),"
      + holder_row(t, true) +
      " prev AS (SELECT term FROM " + e + " WHERE lock_name = $1),"
      " up AS (" + upsert_announcement(e, "me.fence", "$6", "me.instance_id", "me.holder_host", "me") + "),"
      " now_row AS (SELECT * FROM up UNION ALL SELECT * FROM " + e + " WHERE lock_name = $1"
      " AND NOT EXISTS (SELECT 1 FROM up))"
      " SELECT EXISTS (SELECT 1 FROM me), " + record_columns("now_row") + ","
      " CASE WHEN EXISTS (SELECT 1 FROM up) THEN " +
          notify(table, "$7", "CASE WHEN (SELECT term FROM prev) = now_row.term THEN 'p' ELSE 'l' END", "now_row") +
      " END FROM now_row"};

  // The holder gives its term up ($1..$5 as above, $6 the lock hash): the
  // row stays, not leading, and the count moves on. Returns whether the key
  // held the lock, then the row as it is now (already vacated: unchanged).
  s.vacate = {
      "pgmutex_vacate",
      "WITH cfg AS (SELECT " + std::string(forced_synchronous_commit) + ", set_config('lock_timeout', $5, true)),"
      + holder_row(t, false) +
      " up AS (" + vacate_term(e) + "),"
      " now_row AS (SELECT * FROM up UNION ALL SELECT * FROM " + e + " WHERE lock_name = $1"
      " AND NOT EXISTS (SELECT 1 FROM up))"
      " SELECT EXISTS (SELECT 1 FROM me), " + record_columns("now_row") + ","
      " CASE WHEN EXISTS (SELECT 1 FROM up) THEN " + notify(table, "$6", "'v'", "now_row") +
      " END FROM (VALUES (1)) AS one(x) LEFT JOIN now_row ON true"};
}

}  // namespace pgmutex::postgres_detail
