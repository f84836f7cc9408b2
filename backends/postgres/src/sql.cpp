// The text of every statement for one table (sql.hpp): the acquire, the
// heartbeats, release and reads, the schema, the NOTIFY channel.
#include "sql.hpp"

#include <array>
#include <cstdint>
#include <stdexcept>
#include <utility>

#include "pgmutex/table_name.hpp"
#include "sql_parts.hpp"

namespace pgmutex::postgres_detail {
namespace {

// The parts of a name that passed validate_table_name.
TableName parts_of(std::string_view table) { return parse_table_name(table).value(); }

std::string quoted_identifier(std::string_view identifier) {
  std::string out = "\"";
  for (char c : identifier) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  return out + "\"";
}

// "schema"."table", every part quoted: the parts are what psql's rules read.
std::string quote_parts(const TableName& name) {
  return name.schema.empty() ? quoted_identifier(name.name)
                             : quoted_identifier(name.schema) + "." + quoted_identifier(name.name);
}

}  // namespace

namespace sql_parts {

std::string literal(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') out.push_back('\'');
    out.push_back(c);
  }
  return out + "'";
}

}  // namespace sql_parts

namespace {
using namespace sql_parts;

// The sequence lives next to the table: mutex_lock -> mutex_lock_fence_seq (fence_sequence_of).
std::string sequence_of(std::string_view table) { return quote_parts(fence_sequence_of(parts_of(table))); }

// nextval('"schema"."t_fence_seq"').
std::string nextval(std::string_view table) { return "nextval(" + literal(sequence_of(table)) + ")"; }

}  // namespace

namespace sql_parts {
// A grant's fence: the sequence's next value plus (timeline - 1) << 40.
// With asynchronous replication a promoted standby may lack the sequence's
// newest WAL and hand out values the old primary already gave (measured: 34
// after 101); its timeline is higher, so every fence it grants is higher
// than any fence of an earlier timeline, as long as the sequence stays below
// 2^40. On timeline 1 the fence is the sequence's value, as before. The
// timeline is the one WAL is written on now (pg_control_checkpoint() lags
// after a promotion). Needs only USAGE on the sequence: no setval.
const std::string_view timeline_value = "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint";

std::string fence_value(std::string_view table) {
  return "(" + nextval(table) + " + ((" + std::string(timeline_value) + " - 1) << 40))";
}

std::string seconds_since(std::string_view column) {
  return "greatest(0, extract(epoch FROM now() - " + std::string(column) + "))::float8";
}

// The columns a LockRow is read from, in its order. A seed-made row has no
// token, threshold or holder details: they read as 0 or ''.
// Never destroyed: a session's I/O thread may still be making statements
// while the process exits (its last owner let go on it, and nothing waits for
// it to end), and must not read a string that exit destroyed.
const std::string& row_columns = *new std::string(
    "lock_name, instance_id, fence, "
    "(extract(epoch FROM acquired_at) * 1000000)::bigint, " +
    seconds_since("last_heartbeat") + ", "
    "coalesce(grant_token, 0), coalesce(holder_stale_s, 0)::float8, "
    "coalesce(holder_host, ''), coalesce(holder_pid, 0), coalesce(holder_command, '')");

// The table's oid, computed by the server from the quoted name: every spelling
// of one table gives one value. The name is validated, so it is a safe literal.
std::string oid_of(std::string_view table) { return "(" + literal(quote_table(table)) + "::regclass)::oid::bigint"; }

std::string insert_lock_key(std::string_view table) {
  return "(" + oid_of(table) + " << 32) | (hashtext($1)::bigint & 4294967295)";
}

// The NOTIFY channel, built in SQL exactly as release_channel() builds it.
std::string channel_sql(std::string_view table, std::string_view hash_param) {
  return "'pgmutex_' || " + oid_of(table) + "::text || '_' || " + std::string(hash_param);
}

// A row is stale once older than the larger of the reclaimer's threshold ($3)
// and the one its holder stored (NULL in a seed-made row: the reclaimer's).
const std::string_view stale_condition =
    "last_heartbeat < now() - greatest($3::float8, coalesce(holder_stale_s, 0)) * interval '1 second'";

const std::string_view forced_synchronous_commit =
    "set_config('synchronous_commit', CASE WHEN current_setting('synchronous_commit')"
    " IN ('off', 'local') THEN 'on' ELSE current_setting('synchronous_commit') END, true)";

// The failover grace ($9 seconds; 0 off, negative: the default). On a
// timeline above 1 (a promoted standby) nothing that looks free or stale is
// granted until the timeline has been known for the grace: a grant the old
// primary made and this server never received may still be held, for up
// to its holder's stale threshold. When the timeline was first seen is the
// marker row's: lock_name '' (no lock may be called that), fence = the
// timeline, acquired_at = first seen, holder_stale_s = the longest stale
// threshold among the rows then (the default grace is the larger of that
// and the requester's, $3). The marker is written only when it is missing
// or names another timeline, so a losing try on a known timeline still
// writes nothing. A live row is reported as usual: its holder keeps it,
// and its own heartbeats and re-acquire are untouched.
std::string grace_ctes(std::string_view table) {
  const std::string t = quote_table(table);
  const auto grace_of = [](std::string_view longest) {
    return "CASE WHEN $9::float8 > 0 THEN $9::float8 ELSE greatest($3::float8, " + std::string(longest) + ") END";
  };
  const std::string longest_now =
      "(SELECT coalesce(max(holder_stale_s), 0) FROM " + t + " WHERE locked = 1 AND lock_name <> '')";
  return " tl AS (SELECT timeline FROM (SELECT " + std::string(timeline_value) + " AS timeline) AS now_on"
         " WHERE timeline > 1 AND $9::float8 <> 0),"
         " mk AS (SELECT m.acquired_at AS since, coalesce(m.holder_stale_s, 0) AS longest FROM " + t + " AS m, tl"
         " WHERE m.locked = 1 AND m.lock_name = '' AND m.fence = tl.timeline),"
         " mark AS ("
         " INSERT INTO " + t + " AS m (lock_name, locked, instance_id, last_heartbeat, acquired_at, fence, holder_stale_s)"
         " SELECT '', 1, '" + std::string(failover_grace_marker) + "', now(), now(), tl.timeline, " + longest_now +
         " FROM tl WHERE NOT EXISTS (SELECT 1 FROM mk)"
         " ON CONFLICT (locked, lock_name) DO UPDATE SET fence = excluded.fence, acquired_at = excluded.acquired_at,"
         " last_heartbeat = excluded.last_heartbeat, holder_stale_s = excluded.holder_stale_s"
         " WHERE m.fence <> excluded.fence),"
         " grace AS (SELECT max(left_s) AS left_s FROM ("
         " SELECT extract(epoch FROM since - now())::float8 + " + grace_of("longest") + " AS left_s FROM mk"
         " UNION ALL SELECT " + grace_of(longest_now) + " FROM tl WHERE NOT EXISTS (SELECT 1 FROM mk)) AS g),";
}

const std::string_view in_grace = "coalesce((SELECT left_s FROM grace) > 0, false)";

const std::string_view procs_cte =
    "procs AS MATERIALIZED (SELECT pg_stat_get_backend_pid(b) AS pid, pg_stat_get_backend_start(b) AS started"
    " FROM pg_stat_get_backend_idset() AS b)";

std::string alive(std::string_view q) {
  const std::string a(q);
  return "CASE WHEN " + a + ".waiter_pid IS NULL THEN " + a + ".last_seen > now() - " + a +
         ".lease_s * interval '1 second' ELSE EXISTS (SELECT 1 FROM procs AS p WHERE p.pid = " + a +
         ".waiter_pid AND (p.started IS NULL OR p.started = " + a + ".waiter_started)) END";
}

std::string quoted_queue(std::string_view table) {
  const TableName parts = parts_of(table);
  return quote_parts(TableName{parts.schema, derived_identifier("", parts.name, "_queue")});
}

std::string quoted_election(std::string_view table) {
  const TableName parts = parts_of(table);
  return quote_parts(TableName{parts.schema, derived_identifier("", parts.name, "_election")});
}

std::string quoted_sequence(std::string_view table) { return sequence_of(table); }

}  // namespace sql_parts

namespace {
using namespace sql_parts;

// The holder's details ($6 host, $7 pid, $8 command): NULL when not given.
constexpr std::string_view holder_values = " nullif($6::text, ''), nullif($7::bigint, 0), nullif($8::text, '')";

}  // namespace

std::string hash_hex(std::string_view text) {
  std::uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  static constexpr std::array<char, 16> digits{'0', '1', '2', '3', '4', '5', '6', '7',
                                               '8', '9', 'a', 'b', 'c', 'd', 'e', 'f'};
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) out[static_cast<std::size_t>(i)] = digits[h & 0xF];
  return out;
}

Statement::Statement(std::string_view name_prefix, std::string text)
    : name(std::string(name_prefix) + "_" + hash_hex(text)), sql(std::move(text)) {
  if (name.size() > 63) throw std::logic_error("pgmutex: statement name '" + name + "' is over 63 bytes");
}

std::string quote_table(std::string_view table) { return quote_parts(parts_of(table)); }

std::string sql_table(std::string_view table) { return sql_name(parts_of(table)); }

std::string sql_fence_sequence(std::string_view table) { return sql_name(fence_sequence_of(parts_of(table))); }

std::string lock_hash(std::string_view lock_name) { return hash_hex(lock_name); }

std::string release_channel(std::string_view table_oid, std::string_view lock_name) {
  return "pgmutex_" + std::string(table_oid) + "_" + lock_hash(lock_name);
}

std::string own_channel(const std::string& lock_channel, int backend_pid) {
  return lock_channel + "_" + std::to_string(backend_pid);
}

std::string vacancy_channel(const std::string& lock_channel) { return lock_channel + "_v"; }

TableStatements make_statements(std::string_view table, bool heartbeat_synchronous_commit_off) {
  const std::string t = quote_table(table);
  // A statement's name is its kind and a hash of its text (Statement, sql.hpp):
  // the text names the table, so one connection can serve many tables, and
  // two statements share a name only if they share the text.
  TableStatements s;
  s.table = std::string(table);
  s.asynchronous = heartbeat_synchronous_commit_off;
  // lock_timeout is read when a lock wait begins, so setting it inside the
  // statement (in a FROM item, evaluated before any row reaches the update)
  // bounds this statement's row-lock waits without a round trip of its own.
  const auto lock_timeout = [](std::string_view param) {
    return "set_config('lock_timeout', " + std::string(param) + ", true)";
  };

  // Read the row; insert only if there is none (DO NOTHING if someone beat
  // us to it); take it over only if stale. Inserters of one lock draw their
  // fence under a transaction advisory lock keyed by the table's oid and the
  // lock name (so every spelling of the table shares it): without it, an
  // insert that drew its fence, then waited on a rival's insert which
  // committed and was released meanwhile, would land with a fence lower than
  // the rival's grant. Only the insert path takes it (the row was absent), so
  // a losing try against a held lock still touches nothing: no row lock, no
  // transaction id, no WAL. Under READ COMMITTED the UPDATE re-checks its
  // WHERE on the newest row version, so of two reclaimers only the first wins.
  //
  // The failover grace ($9 seconds; 0 off, negative: the default). On a
  // timeline above 1 (a promoted standby) nothing that looks free or stale is
  // granted until the timeline has been known for the grace: a grant the old
  // primary made and this server never received may still be held, for up
  // to its holder's stale threshold. When the timeline was first seen is the
  // marker row's: lock_name '' (no lock may be called that), fence = the
  // timeline, acquired_at = first seen, holder_stale_s = the longest stale
  // threshold among the rows then (the default grace is the larger of that
  // and the requester's, $3). The marker is written only when it is missing
  // or names another timeline, so a losing try on a known timeline still
  // writes nothing. A live row is reported as usual: its holder keeps it,
  // and its own heartbeats and re-acquire are untouched.
  const std::string no_marker = " AND lock_name <> ''";
  // The queue's rule (issue 17): a plain try loses to any live waiter that
  // has no offer yet, and to an offer that has not lapsed (the offered row
  // reads as a holder whose token is 0, so nobody adopts it); it takes over
  // an offer that lapsed (its handoff deadline passed: see offer_cte in
  // queue_sql.cpp) as it takes over a stale row. The backend-status snapshot is read only
  // when the lock has queue rows; a losing try still writes nothing.
  const std::string q = quoted_queue(table);
  // `announce`: a campaign's try (TableStatements::election_acquire): a
  // grant it makes (ins or upd) announces its value in the same statement.
  const auto acquire_sql = [&](const ElectionParts* announce) {
    return "WITH " + std::string(procs_cte) + ", cur AS ("
               " SELECT instance_id, fence, last_heartbeat, " + seconds_since("last_heartbeat") + " AS age,"
               " coalesce(grant_token, 0) AS token, " + std::string(stale_condition) + " AS stale"
               " FROM " + t + " WHERE locked = 1 AND lock_name = $1),"
               " queued AS (SELECT 1 FROM " + q + " AS q WHERE q.lock_name = $1 AND q.offered_fence IS NULL AND " +
                   alive("q") + " LIMIT 1),"
               " offered AS (SELECT q.offered_until < now() AS lapsed FROM " + q + " AS q"
               " JOIN cur ON cur.fence = q.offered_fence AND cur.token = q.waiter_token AND cur.instance_id = q.instance_id"
               " WHERE q.lock_name = $1)," + grace_ctes(table) +
               " ins AS ("
               " INSERT INTO " + t + " (lock_name, locked, instance_id, last_heartbeat, acquired_at, fence,"
               " grant_token, holder_stale_s, holder_host, holder_pid, holder_command)"
               " SELECT $1, 1, $2, now(), now(), " + fence_value(table) + ", nullif($4::bigint, 0), $3::float8," +
               std::string(holder_values) +
               " FROM (SELECT pg_advisory_xact_lock(" + insert_lock_key(table) + ")) AS serialized"
               " WHERE NOT EXISTS (SELECT 1 FROM cur) AND NOT EXISTS (SELECT 1 FROM queued) AND NOT " +
               std::string(in_grace) +
               " ON CONFLICT (locked, lock_name) DO NOTHING RETURNING fence),"
               " upd AS ("
               " UPDATE " + t + " SET instance_id = $2, last_heartbeat = now(), acquired_at = now(),"
               " fence = " + fence_value(table) + ", grant_token = nullif($4::bigint, 0), holder_stale_s = $3::float8,"
               " (holder_host, holder_pid, holder_command) = (SELECT" + std::string(holder_values) + ")"
               " WHERE locked = 1 AND lock_name = $1 AND NOT EXISTS (SELECT 1 FROM queued) AND NOT " +
               std::string(in_grace) +
               " AND ((" + std::string(stale_condition) + " AND EXISTS (SELECT 1 FROM cur WHERE cur.stale))"
               " OR (EXISTS (SELECT 1 FROM offered WHERE offered.lapsed)"
               " AND (fence, last_heartbeat) = (SELECT c2.fence, c2.last_heartbeat FROM cur AS c2)))"
               " RETURNING fence)" + (announce ? "," + announce->ctes : std::string()) +
               " SELECT (SELECT fence FROM ins), (SELECT fence FROM upd), c.instance_id, c.fence, c.age,"
               " CASE WHEN EXISTS (SELECT 1 FROM offered) THEN 0 ELSE c.token END, c.stale,"
               " (SELECT left_s FROM grace), EXISTS (SELECT 1 FROM queued)" + (announce ? announce->columns : std::string()) +
               " FROM (VALUES (1)) AS one(x)"
               // A grant must survive a server crash even on a (pooled) session
               // that turned synchronous_commit off: raise it for this statement only.
               " CROSS JOIN (SELECT " + std::string(forced_synchronous_commit) + ", " + lock_timeout("$5") + ") AS cfg"
               " LEFT JOIN cur AS c ON true";
  };
  s.acquire = {"pgmutex_acquire", acquire_sql(nullptr)};
  // $10 the value, $11 the lock hash.
  const ElectionParts announce = announce_with_grant(table, "SELECT fence FROM ins UNION ALL SELECT fence FROM upd", "$10", "$11");
  s.election_acquire = {"pgmutex_election_acquire", acquire_sql(&announce)};

  // synchronous_commit is read at commit: set_config(..., true) inside the
  // statement decides it for this one implicit transaction, whatever the
  // server, the role, the database or a pooled session says. A heartbeat the
  // mutex counts as durable forces it on (a server with synchronous_commit
  // off would otherwise acknowledge beats a crash forgets); an asynchronous
  // one turns it off, and reads where the WAL ends and how far it is flushed
  // before it writes anything (in the FROM item, evaluated before any row
  // reaches the update): the mutex trusts an asynchronous beat only once a
  // later answer shows its commit flushed (BackendReportsDurability).
  const std::string force_sync =
      ", set_config('synchronous_commit', CASE WHEN current_setting('synchronous_commit')"
      " IN ('off', 'local') THEN 'on' ELSE current_setting('synchronous_commit') END, true)";
  const std::string wal_columns = ", (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::int8 AS wal_before,"
                                  " (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::int8 AS wal_flushed";
  const std::string commit_mode =
      heartbeat_synchronous_commit_off ? ", set_config('synchronous_commit', 'off', true)" + wal_columns : force_sync;
  const std::string wal_returned = heartbeat_synchronous_commit_off ? " RETURNING cfg.wal_before, cfg.wal_flushed" : "";
  // A grant is named by instance, fence and token; a seed-made row (no token) by token 0.
  s.heartbeat = {"pgmutex_heartbeat",
                 "UPDATE " + t + " SET last_heartbeat = now() FROM (SELECT " + lock_timeout("$5") + commit_mode +
                     ") AS cfg WHERE locked = 1 AND lock_name = $1 AND instance_id = $2 AND fence = $3"
                     " AND coalesce(grant_token, 0) = $4::bigint" + wal_returned};

  // Raised to a synchronous commit for this statement only, as the acquire does.
  s.heartbeat_durable = {"pgmutex_heartbeat_durable",
                         "UPDATE " + t + " SET last_heartbeat = now() FROM (SELECT " + lock_timeout("$5") + force_sync +
                             ") AS cfg WHERE locked = 1 AND lock_name = $1 AND instance_id = $2 AND fence = $3"
                             " AND coalesce(grant_token, 0) = $4::bigint"};

  // Each key matched returns its position in the arrays (1-based), not its
  // text: less to send and parse. The keys must be distinct (the caller
  // folds duplicates): a row joined to two keys is updated, and returned, once.
  const std::string keys_of = " unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) WITH ORDINALITY"
                              " AS k(lock_name, instance_id, fence, token, i)";
  const std::string key_matches = " WHERE t.locked = 1 AND t.lock_name = k.lock_name AND t.instance_id = k.instance_id"
                                  " AND t.fence = k.fence AND coalesce(t.grant_token, 0) = k.token";
  // Asynchronous: each row returned carries the WAL positions too (read once).
  const std::string wal_of_cfg = heartbeat_synchronous_commit_off ? ", cfg.wal_before, cfg.wal_flushed" : "";
  s.heartbeat_many = {"pgmutex_heartbeat_many",
                      "UPDATE " + t + " AS t SET last_heartbeat = now() FROM" + keys_of + "," +
                          " (SELECT " + lock_timeout("$5") + commit_mode + ") AS cfg" + key_matches + " RETURNING k.i" +
                          wal_of_cfg};

  // The rows are locked first, skipping those another transaction holds; the
  // UPDATE then finds them by the unique index (locked, lock_name). The
  // lock costs a WAL record per row of its own (BENCHMARKS.md, Sessions).
  s.heartbeat_many_skip_locked = {
      "pgmutex_heartbeat_many_skip_locked",
      "WITH mine AS (SELECT t.lock_name, k.i" + wal_of_cfg + " FROM " + t + " AS t," + keys_of + "," +
          " (SELECT " + lock_timeout("$5") + commit_mode + ") AS cfg" + key_matches + " FOR UPDATE OF t SKIP LOCKED)"
          " UPDATE " + t + " AS t SET last_heartbeat = now() FROM mine WHERE t.locked = 1 AND t.lock_name = mine.lock_name"
          " RETURNING mine.i" + (heartbeat_synchronous_commit_off ? ", mine.wal_before, mine.wal_flushed" : "")};

  // The NOTIFY is sent at commit, only if the row was ours: a handoff to
  // the first live waiter, or '' when the row went (queue_sql.cpp).
  s.release = handoff_release(table, true, "pgmutex_release");
  s.election_release = handoff_release(table, true, "pgmutex_election_release", /*vacate=*/true);

  s.inspect = {"pgmutex_inspect",
               "SELECT " + row_columns + " FROM " + t + " WHERE locked = 1 AND lock_name = $1" + no_marker};
  s.list = {"pgmutex_list",
            "SELECT " + row_columns + " FROM " + t + " WHERE locked = 1" + no_marker + " ORDER BY lock_name"};
  s.force_release = handoff_release(table, false, "pgmutex_force_release");
  add_queue_statements(s, table);
  add_election_statements(s, table);
  return s;
}

// Half of each page is left free so that a heartbeat's new row version fits
// on its page: the update is then HOT (only last_heartbeat changes, and the
// one index is on locked, lock_name), so no index entry is written and the
// page's old versions are pruned in place. A batch needs room for the new
// versions of all of a page's rows at once (one transaction). Measured on
// 1,000 rows beaten 23 times (benchmarks/postgres/explain_heartbeat_many.sh):
// 99.99% HOT at 50 (70: 95%, 90: 72%, the default 100: 12%); per batch 80 kB
// of WAL against 267 kB, and 2.5 against 3.9 ms of execution (fastest of 15).
constexpr std::string_view fillfactor = "50";

std::string create_schema_sql(std::string_view table) {
  const std::string t = quote_table(table);
  const std::string t_literal = literal(t);
  const std::string sequence = sequence_of(table);
  // A UNIQUE constraint's index name is per schema, so it is made from the
  // table name (the default table keeps the seed's uq_mutex_lock).
  const std::string uq = quoted_identifier(unique_constraint_of(parts_of(table)));
  const std::string chk = "\"chk_locked\"";  // CHECK names are per table: the seed's name fits every table
  // Each missing column is added only after a catalog check: ALTER TABLE takes
  // an ACCESS EXCLUSIVE lock even when IF NOT EXISTS makes it a no-op, and
  // that would stall every holder's heartbeat on each create_schema call.
  const auto add_if_missing = [&](std::string_view column, std::string_view definition) {
    return "  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = " + t_literal + "::regclass AND attname = '" +
           std::string(column) + "' AND NOT attisdropped) THEN\n"
           "    ALTER TABLE " + t + " ADD COLUMN IF NOT EXISTS " + std::string(column) + " " +
           std::string(definition) + ";\n  END IF;\n";
  };
  return "SET LOCAL client_min_messages = warning;\n"
         // Two processes creating the schema at once would race on the catalog.
         "SELECT pg_advisory_xact_lock(hashtext('pgmutex.create_schema'));\n"
         // A table with fences but no sequence of the name derived now: made
         // by a pgmutex that let Postgres cut a long derived name short. A
         // new sequence would restart fences at 1: refuse, and say what to rename.
         "DO $pgmutex$ DECLARE fence_default text; BEGIN\n"
         "  IF to_regclass(" + literal(sequence) + ") IS NULL AND to_regclass(" + t_literal + ") IS NOT NULL THEN\n"
         "    SELECT pg_get_expr(d.adbin, d.adrelid) INTO fence_default FROM pg_attrdef d JOIN pg_attribute a\n"
         "      ON a.attrelid = d.adrelid AND a.attnum = d.adnum WHERE d.adrelid = " + t_literal + "::regclass AND a.attname = 'fence';\n"
         "    IF fence_default IS NOT NULL THEN\n"
         "      RAISE EXCEPTION 'lock table % has fences but no sequence %', " + literal(t) + ", " + literal(sequence) + "\n"
         "        USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'its fence column reads ' || fence_default ||\n"
         "        ': rename that sequence to ' || " + literal(sequence) + " || ' (ALTER SEQUENCE ... RENAME TO ...), so that fences keep increasing';\n"
         "    END IF;\n"
         "  END IF;\n"
         "END $pgmutex$;\n"
         "CREATE SEQUENCE IF NOT EXISTS " + sequence + ";\n"
         "CREATE TABLE IF NOT EXISTS " + t + " (\n"
         "  lock_name      VARCHAR(64) NOT NULL,\n"
         "  locked         INT NOT NULL DEFAULT 1,\n"
         "  instance_id    VARCHAR(64) NOT NULL,\n"
         "  last_heartbeat TIMESTAMPTZ NOT NULL,\n"
         "  acquired_at    TIMESTAMPTZ NOT NULL,\n"
         "  fence          BIGINT NOT NULL DEFAULT " + nextval(table) + ",\n"
         "  grant_token    BIGINT,\n"
         "  holder_stale_s DOUBLE PRECISION,\n"
         "  holder_host    TEXT,\n"
         "  holder_pid     BIGINT,\n"
         "  holder_command TEXT,\n"
         "  CONSTRAINT " + uq + " UNIQUE (locked, lock_name),\n"
         "  CONSTRAINT " + chk + " CHECK (locked = 1)\n"
         ") WITH (fillfactor = " + std::string(fillfactor) + ");\n"
         // A table made by the seed's DDL (or an older pgmutex): existing rows
         // get fresh fences, and no token, threshold or holder details (NULL).
         "DO $pgmutex$ BEGIN\n" +
         add_if_missing("fence", "BIGINT NOT NULL DEFAULT " + nextval(table)) +
         add_if_missing("grant_token", "BIGINT") + add_if_missing("holder_stale_s", "DOUBLE PRECISION") +
         add_if_missing("holder_host", "TEXT") + add_if_missing("holder_pid", "BIGINT") +
         add_if_missing("holder_command", "TEXT") +
         // Set only where no fillfactor was chosen, and only by the owner: it
         // is a speed-up, and a non-owner's create_schema of an up-to-date
         // table must keep succeeding. SET takes a SHARE UPDATE EXCLUSIVE
         // lock, which no heartbeat waits for; pages written before keep
         // their old fill until their rows move.
         "  IF NOT EXISTS (SELECT 1 FROM pg_class c, pg_options_to_table(c.reloptions) o WHERE c.oid = " + t_literal +
         "::regclass AND o.option_name = 'fillfactor')\n"
         "     AND pg_has_role((SELECT relowner FROM pg_class WHERE oid = " + t_literal + "::regclass), 'USAGE') THEN\n"
         "    ALTER TABLE " + t + " SET (fillfactor = " + std::string(fillfactor) + ");\n  END IF;\n"
         "END $pgmutex$;\n" + fences_past_terms_sql(table) + create_queue_sql(table) + create_election_sql(table);
}

}  // namespace pgmutex::postgres_detail
