// The text of the queue's statements (issue 17, /work/notes/queue-design.md
// §1.4): the release that hands the lock over in place, a waiter's queued
// try, enqueue and dequeue, and the queue table itself.
//
// Lock order, kept in every statement: the lock row before any queue row
// (each CTE that writes the queue reads one that wrote or locked the lock
// row, or for a free lock the insert's advisory lock), so two statements do
// not wait on each other, and the places a statement offers are locked in
// ticket order. A queued try that waited for another's insert of a free
// lock's row works from a snapshot without that row, so the places it locks
// are out of that order for a release (or takeover) of the new row: the
// sweeps, the one write of places outside ticket order, therefore skip a
// place another statement holds (FOR UPDATE SKIP LOCKED: it is garbage, left
// for the next sweep) and never wait for one. Before, such a release and
// such a try could each wait for the other until Postgres ended one after
// deadlock_timeout (40P01). The dequeue is the exception to the order: it
// deletes its own place without the lock row, and waits for nothing after
// (it reads the lock row unlocked, and the place it names SKIP LOCKED).
// Left: a rejoin writes the caller's own place last; a cycle through two
// rejoins is not known to be reachable, and Postgres would end it the same
// way (the caller retries).
//
// Every takeover is an UPDATE ... WHERE that Postgres re-checks on the
// newest row version, and every grant draws a new fence: the queue decides
// only who is next.
#include <string>

#include "pgmutex/table_name.hpp"
#include "sql.hpp"
#include "sql_parts.hpp"

namespace pgmutex::postgres_detail {

using namespace sql_parts;

namespace {

// The head's grant written into the lock row (instance, fresh fence, token,
// threshold and details from its queue row `head`).
std::string grant_to_head(std::string_view table) {
  return "instance_id = head.instance_id, fence = " + fence_value(table) +
         ", grant_token = head.waiter_token, last_heartbeat = now(), acquired_at = now(),"
         " holder_stale_s = head.stale_s, holder_host = head.holder_host, holder_pid = head.holder_pid,"
         " holder_command = head.holder_command";
}

// The first two live waiters with no offer yet (`when`: only if this holds),
// the head and the runner-up, their places locked: a place that leaves
// (its dequeue) while the statement runs is skipped, not offered the lock.
// Unlocked, the offer's UPDATE of a place deleted meanwhile wrote nothing,
// and the lock row was left offered to no one until its stale threshold.
// `when` must hold the lock row (or, for a free lock, the insert's advisory
// lock) first: the order every statement keeps (the header).
std::string head_ctes(const std::string& q, const std::string& who_lives, const std::string& when) {
  return " live AS (SELECT q.* FROM " + q + " AS q WHERE q.lock_name = $1 AND q.offered_fence IS NULL AND " + when +
         " AND " + who_lives + " ORDER BY q.ticket LIMIT 2 FOR UPDATE OF q),"
         " head AS (SELECT * FROM live ORDER BY ticket LIMIT 1),"
         " nxt AS (SELECT ticket, waiter_pid FROM live ORDER BY ticket OFFSET 1 LIMIT 1),";
}

// The head's handoff deadline in milliseconds, as the runner-up reads it.
constexpr std::string_view head_handoff_ms = "(SELECT ceil(handoff_s * 1000)::bigint FROM head)";

// off: the place the lock row is offered to, if it is an offer (matched to
// `cur` by fence, token and instance): its ticket, whether the offer lapsed
// (its handoff deadline passed), and how long it may still stand in ms,
// which a runner-up no NOTIFY named waits for. An offer lapses at its
// deadline only, even when its waiter's backend died: a waiter's confirm
// may commit unflushed (confirm_offer), and a server crash, which ends
// every backend, can take that commit back and leave the offer standing
// while the waiter holds the lock until the deadline (the bound its confirm
// returned). A waiter that died before its release is skipped by the
// release itself (head_ctes); one that dies between the offer and its
// confirm costs the line the handoff deadline, as a frozen one does.
std::string offer_cte(const std::string& q) {
  return " off AS (SELECT q.ticket, q.offered_until < now() AS lapsed,"
         " ceil(extract(epoch FROM (q.offered_until - now())) * 1000)::bigint AS left_ms FROM " + q + " AS q"
         " JOIN cur ON cur.fence = q.offered_fence AND cur.token = q.waiter_token AND cur.instance_id = q.instance_id"
         " WHERE q.lock_name = $1),";
}

// 'o:<fence>:<head>:<runner-up or 0>:<ms>', the offer's payload: the
// runner-up looks when the ms have passed. An offer names the head and
// runner-up it made (head_ctes) and the head's handoff deadline; a leaving
// runner-up's dequeue names the next one and how long the offer may still
// stand (queue_rules.hpp reads both alike).
std::string offer_payload(const std::string& fence, const std::string& head = "(SELECT ticket FROM head)",
                          const std::string& runner_up = "coalesce((SELECT ticket FROM nxt), 0)",
                          const std::string& ms = std::string(head_handoff_ms)) {
  return "'o:' || " + fence + " || ':' || " + head + " || ':' || " + runner_up + " || ':' || " + ms;
}

// The NOTIFYs of an offer (or of a lock left free), `payload` on each
// channel: the lock's (a Session's waiters, a wait for a release without a
// place) and the head's and the runner-up's own (the lock's channel, '_',
// their backend's pid), where a waiter on a connection of its own listens:
// the other waiters' processes sleep through an offer that is not theirs
// (their server processes are still signalled: Postgres signals every
// listening backend of the database). `vacant`: when this holds (nobody was
// offered the lock), on the lock's vacancy channel too ('_v'), which those
// waiters also listen on: one whose place the statement did not see (taken
// as it ran) then looks. The column's value (the number sent) is not read.
// `named`: the waiters whose own channels it goes on (a query of their
// waiter_pid).
std::string notify_offer(std::string_view table, const std::string& hash, const std::string& payload,
                         const std::string& vacant = "false",
                         const std::string& named = "SELECT waiter_pid FROM head UNION ALL SELECT waiter_pid FROM nxt") {
  const std::string lock_channel = channel_sql(table, hash);
  return "(SELECT count(pg_notify(n.ch, " + payload + ")) FROM (SELECT " + lock_channel + " AS ch UNION ALL SELECT " +
         lock_channel + " || '_' || w.waiter_pid FROM (" + named + ") AS w WHERE w.waiter_pid IS NOT NULL"
         " UNION ALL SELECT " + lock_channel + " || '_v' WHERE " + vacant + ") AS n)";
}

}  // namespace

// R: the holder's release (keyed) or an administrator's (force). The row
// goes to the first live waiter as an offer (a NOTIFY naming it and the
// runner-up, on the lock's channel and on theirs: notify_offer), or is
// deleted when nobody live waits (NOTIFY '' on the lock's channel and its
// vacancy channel). Waiters
// ahead of the head are dead, and offers ahead of it orphaned: swept.
//
// `vacate` (keyed only): a leadership's resign. The same statement vacates
// the holder's term if it is announced (the election row after the lock
// row, as every election statement) and tells observers on the election's
// channel, with a synchronous commit as every election write: observers
// hear 'vacated' from the commit that wakes the next in line.
Statement handoff_release(std::string_view table, bool keyed, const std::string& name, bool vacate) {
  const std::string t = quote_table(table);
  const std::string q = quoted_queue(table);
  const std::string lt = keyed ? "$6" : "$3";
  const std::string hash = keyed ? "$5" : "$2";
  const std::string key = keyed ? " AND t.instance_id = $2 AND t.fence = $3 AND coalesce(t.grant_token, 0) = $4::bigint"
                                : "";
  const ElectionParts vacated = vacate ? vacate_with_release(table, hash) : ElectionParts{};
  // Synchronous whatever the server says (a DBA's synchronous_commit = off):
  // the offer must be durable before its waiter sees it, for a confirm that
  // commits unflushed (confirm_offer) is bounded by what the offer left
  // behind, and a crash must not take the offer back to an older row.
  const std::string durable = std::string(forced_synchronous_commit) + ", ";
  return {name,
          "WITH " + std::string(procs_cte) + ", cfg AS (SELECT " + durable + "set_config('lock_timeout', " + lt +
              ", true)),"
          " me AS (SELECT t.* FROM " + t + " AS t, cfg WHERE t.locked = 1 AND t.lock_name = $1 AND t.lock_name <> ''" +
              key + " FOR UPDATE OF t)," + vacated.ctes +
              head_ctes(q, alive("q"), "EXISTS (SELECT 1 FROM me)") +
              " offer AS (UPDATE " + t + " AS t SET " + grant_to_head(table) +
              " FROM me, head WHERE t.locked = 1 AND t.lock_name = $1 AND t.fence = me.fence RETURNING t.fence),"
              " offer_mark AS (UPDATE " + q + " AS q SET offered_fence = offer.fence,"
              " offered_until = now() + q.handoff_s * interval '1 second'"
              " FROM offer, head WHERE q.lock_name = $1 AND q.ticket = head.ticket RETURNING q.ticket),"
              " gone AS (DELETE FROM " + t + " AS t USING me WHERE NOT EXISTS (SELECT 1 FROM head)"
              " AND t.locked = 1 AND t.lock_name = $1 AND t.fence = me.fence RETURNING 1),"
              // Garbage ahead of the head; a place another statement holds is left (the header).
              " sweep AS (SELECT q.ticket FROM " + q + " AS q, me WHERE q.lock_name = $1"
              " AND q.ticket < coalesce((SELECT ticket FROM head), 9223372036854775807)"
              " AND (q.offered_fence IS NOT NULL OR NOT " + alive("q") + ") FOR UPDATE OF q SKIP LOCKED),"
              " swept AS (DELETE FROM " + q + " AS q USING sweep WHERE q.lock_name = $1"
              " AND q.ticket = sweep.ticket RETURNING 1)"
              " SELECT " + std::string(row_columns) + ", " +
              notify_offer(table, hash,
                           "CASE WHEN EXISTS (SELECT 1 FROM offer_mark) THEN " +
                               offer_payload("(SELECT fence FROM offer)") + " ELSE '' END",
                           "NOT EXISTS (SELECT 1 FROM offer_mark)") +
              ", (SELECT count(*) FROM swept)" + vacated.columns + " FROM me"};
}

void add_queue_statements(TableStatements& s, std::string_view table) {
  const std::string t = quote_table(table);
  const std::string q = quoted_queue(table);
  const std::string ours = "q.lock_name = $1 AND q.ticket = $10 AND q.waiter_token = $4::bigint";
  // The started time of this connection's backend, for a pid-bound waiter.
  const std::string my_start = "(SELECT p.started FROM procs AS p WHERE p.pid = pg_backend_pid())";

  // The queued try. 1: the lock row carries our token (an offer, or our
  // grant after a lost reply): confirm it. 2: else our place is gone (or
  // was offered and passed on): lost. 3: else, the lock available (free,
  // stale, a lapsed offer) and no grace in force, the first live waiter
  // gets it: we directly (our place goes), or an offer to that head. We
  // count as alive ourselves (we are asking); our row is re-attached to
  // this backend if it named a dead one (a reconnect), and a pooled
  // waiter's lease is refreshed.
  // `announce`: a campaign's (TableStatements::election_acquire_queued): a
  // grant it confirms (conf) or takes (took) for itself announces its value
  // in the same statement.
  const auto acquire_queued_sql = [&](const ElectionParts* announce) {
    return "WITH " + std::string(procs_cte) + ","
      // $6..$8 (the holder's details) are the queue row's here: typed, unused.
      " cfg AS (SELECT " + std::string(forced_synchronous_commit) + ", set_config('lock_timeout', $5, true),"
      " $6::text AS host, $7::bigint AS pid, $8::text AS command),"
      " cur AS (SELECT instance_id, fence, last_heartbeat, " + seconds_since("last_heartbeat") + " AS age,"
      " coalesce(grant_token, 0) AS token, " + std::string(stale_condition) + " AS stale"
      " FROM " + t + ", cfg WHERE locked = 1 AND lock_name = $1),"
      " me AS (SELECT q.offered_fence, q.waiter_pid, " + alive("q") + " AS alive FROM " + q + " AS q WHERE " + ours + "),"
      " mine_now AS (SELECT 1 FROM cur WHERE cur.token = $4::bigint AND cur.instance_id = $2),"
      " conf AS (UPDATE " + t + " AS t SET last_heartbeat = now() FROM cfg WHERE t.locked = 1 AND t.lock_name = $1"
      " AND t.instance_id = $2 AND t.grant_token = $4::bigint AND EXISTS (SELECT 1 FROM mine_now) RETURNING t.fence),"
      " conf_out AS (DELETE FROM " + q + " AS q WHERE " + ours + " AND EXISTS (SELECT 1 FROM conf) RETURNING 1),"
      " queued_here AS (SELECT 1 FROM me WHERE me.offered_fence IS NULL AND NOT EXISTS (SELECT 1 FROM mine_now)),"
      " lost AS (SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM mine_now) AND NOT EXISTS (SELECT 1 FROM queued_here)),"
      " lost_out AS (DELETE FROM " + q + " AS q WHERE " + ours + " AND EXISTS (SELECT 1 FROM lost) RETURNING 1)," +
      offer_cte(q) + grace_ctes(table) +
      " avail AS (SELECT 1 FROM queued_here WHERE NOT " + std::string(in_grace) +
      " AND (NOT EXISTS (SELECT 1 FROM cur) OR coalesce((SELECT stale FROM cur), false)"
      " OR coalesce((SELECT lapsed FROM off), false)))," +
      // Before the places are locked (head_ctes), the lock row if it is to
      // be taken over, or the insert's advisory lock if the lock is free.
      " gate_row AS (SELECT 1 FROM " + t + " AS t WHERE t.locked = 1 AND t.lock_name = $1"
      " AND EXISTS (SELECT 1 FROM cur) AND EXISTS (SELECT 1 FROM avail) FOR UPDATE OF t),"
      " gate_free AS (SELECT pg_advisory_xact_lock(" + insert_lock_key(table) + ") AS done"
      " WHERE NOT EXISTS (SELECT 1 FROM cur) AND EXISTS (SELECT 1 FROM avail))," +
      head_ctes(q, "((q.ticket = $10 AND q.waiter_token = $4::bigint) OR " + alive("q") + ")",
                "EXISTS (SELECT 1 FROM avail) AND (EXISTS (SELECT 1 FROM gate_row) OR EXISTS (SELECT 1 FROM gate_free))") +
      " upd AS (UPDATE " + t + " AS t SET " + grant_to_head(table) + " FROM head, cur WHERE t.locked = 1"
      " AND t.lock_name = $1 AND t.fence = cur.fence AND t.last_heartbeat = cur.last_heartbeat RETURNING t.fence),"
      " ins AS (INSERT INTO " + t + " (lock_name, locked, instance_id, last_heartbeat, acquired_at, fence,"
      " grant_token, holder_stale_s, holder_host, holder_pid, holder_command)"
      " SELECT $1, 1, head.instance_id, now(), now(), " + fence_value(table) + ", head.waiter_token, head.stale_s,"
      " head.holder_host, head.holder_pid, head.holder_command FROM head,"
      " (SELECT pg_advisory_xact_lock(" + insert_lock_key(table) + ")) AS serialized"
      " WHERE NOT EXISTS (SELECT 1 FROM cur) ON CONFLICT (locked, lock_name) DO NOTHING RETURNING fence),"
      " granted AS (SELECT fence FROM upd UNION ALL SELECT fence FROM ins),"
      " took AS (DELETE FROM " + q + " AS q WHERE " + ours + " AND q.ticket = (SELECT ticket FROM head)"
      " AND EXISTS (SELECT 1 FROM granted) RETURNING 1),"
      " offer_mark AS (UPDATE " + q + " AS q SET offered_fence = (SELECT fence FROM granted),"
      " offered_until = now() + q.handoff_s * interval '1 second' WHERE q.lock_name = $1"
      " AND q.ticket = (SELECT ticket FROM head) AND q.ticket <> $10 AND EXISTS (SELECT 1 FROM granted) RETURNING q.ticket),"
      // As the release's sweep: a place another statement holds is left (the header).
      " sweep AS (SELECT q.ticket FROM " + q + " AS q WHERE q.lock_name = $1 AND q.ticket <> $10"
      " AND EXISTS (SELECT 1 FROM granted)"
      " AND (q.ticket IN (SELECT ticket FROM off WHERE lapsed) OR (q.ticket < (SELECT ticket FROM head)"
      " AND q.offered_fence IS NULL AND NOT " + alive("q") + ")) FOR UPDATE OF q SKIP LOCKED),"
      " swept AS (DELETE FROM " + q + " AS q USING sweep WHERE q.lock_name = $1 AND q.ticket = sweep.ticket RETURNING 1),"
      // An offer that stands, with us the first live waiter behind it: how
      // long it may still stand (ms), so that we look again when it lapses.
      // A probe that fired before the offer lapsed (an earlier pgmutex's
      // payload has no deadline), or a NOTIFY lost with a connection, would
      // otherwise leave the runner-up to its stale threshold.
      " watch AS (SELECT left_ms FROM off WHERE NOT off.lapsed"
      " AND EXISTS (SELECT 1 FROM queued_here) AND NOT EXISTS (SELECT 1 FROM avail)"
      " AND NOT EXISTS (SELECT 1 FROM " + q + " AS a WHERE a.lock_name = $1 AND a.offered_fence IS NULL"
      " AND a.ticket < $10 AND " + alive("a") + ")),"
      " rejoin AS (UPDATE " + q + " AS q SET last_seen = now(),"
      " waiter_pid = CASE WHEN q.waiter_pid IS NULL THEN NULL ELSE pg_backend_pid() END,"
      " waiter_started = CASE WHEN q.waiter_pid IS NULL THEN NULL ELSE " + my_start + " END"
      " WHERE " + ours + " AND EXISTS (SELECT 1 FROM queued_here) AND NOT EXISTS (SELECT 1 FROM took)"
      " AND (q.waiter_pid IS NULL OR (NOT (SELECT alive FROM me) AND pg_backend_pid() = $11::int)) RETURNING 1)" +
      (announce ? "," + announce->ctes : std::string()) +
      " SELECT (SELECT fence FROM conf), (SELECT g.fence FROM granted AS g WHERE EXISTS (SELECT 1 FROM took)),"
      " EXISTS (SELECT 1 FROM lost), c.instance_id, c.fence, c.age,"
      " CASE WHEN EXISTS (SELECT 1 FROM off) THEN 0 ELSE c.token END, c.stale, (SELECT left_s FROM grace),"
      " (SELECT fence FROM granted), (SELECT instance_id FROM head),"
      " CASE WHEN EXISTS (SELECT 1 FROM offer_mark) THEN " +
          notify_offer(table, "$12", offer_payload("(SELECT fence FROM granted)")) + " END,"
      " (SELECT count(*) FROM rejoin) + (SELECT count(*) FROM conf_out) + (SELECT count(*) FROM lost_out)"
      " + (SELECT count(*) FROM swept),"
      // The runner-up this try's offer named, and the head's deadline: a
      // waiter does not hear its own NOTIFY (pq_connection.cpp), so the
      // answer says whether it is now the runner-up that watches the head.
      // Else, with an offer standing and us first behind it: us, and how
      // long the offer may still stand (watch).
      " CASE WHEN EXISTS (SELECT 1 FROM offer_mark) THEN (SELECT ticket FROM nxt)"
      " WHEN EXISTS (SELECT 1 FROM watch) THEN $10 END,"
      " CASE WHEN EXISTS (SELECT 1 FROM offer_mark) THEN " + std::string(head_handoff_ms) +
      " ELSE (SELECT left_ms FROM watch) END" + (announce ? announce->columns : std::string()) +
      " FROM (VALUES (1)) AS one(x) LEFT JOIN cur AS c ON true";
  };
  s.acquire_queued = {"pgmutex_acquire_queued", acquire_queued_sql(nullptr)};
  // $13 the value ($12 the lock hash, as above).
  const ElectionParts announce = announce_with_grant(
      table, "SELECT fence FROM conf UNION ALL SELECT g.fence FROM granted AS g WHERE EXISTS (SELECT 1 FROM took)",
      "$13", "$12");
  s.election_acquire_queued = {"pgmutex_election_acquire_queued", acquire_queued_sql(&announce)};

  // The queued try's confirm alone, for a waiter that heard its offer: the
  // same conf and conf_out as above (the lock row carries our token: touch
  // it, and our place goes), and nothing else. When the row does not carry
  // our token it writes nothing and the caller runs the whole queued try,
  // which also tells a lapsed offer from a lost place. The full statement is
  // some 8 KB that a fresh connection plans in milliseconds on its first
  // executions (custom plans), which every `pgmutex run` paid in its handoff.
  //
  //
  // The confirm commits without waiting for its WAL flush when it can bound
  // what a crash before that flush would leave (unflushed, below): the row
  // and place as the release wrote them, durably, which the queue gives to
  // another waiter only once the offer lapses (offered_until: an offer no
  // longer lapses when its waiter's backend dies, offer_cte) or the row goes
  // stale (its last_heartbeat, the release's, plus the waiter's threshold).
  // The answer's third column is that bound in ms from now (NULL: committed
  // synchronously), and the grant is provisional until a synchronous commit
  // of the same server session (whose flush passes this commit's) shows it
  // durable: the holder's first heartbeat, sent at once (GrantBook). Only a
  // place bound to this very backend (waiter_pid): a crash then ends this
  // connection, so the heartbeat that proves the grant runs in another
  // session and proves nothing (behind a pooler, the server connection
  // could change under one client session). Only with enough left (the
  // window, in seconds, 1 ms at least, so that the bound in whole ms is never
  // 0; negative: never, PostgresOptions::unflushed_confirm_window):
  // a bound shorter than the first heartbeat's round trip would lose the
  // lease it grants. A campaign's announcement rides on the same commit:
  // observers may hear of a term a crash then takes back, as after an
  // asynchronous failover (ObserverCursor: another history, nobody leads).
  const auto confirm_offer_sql = [&](const ElectionParts* announce) {
    const std::string window = announce ? "$9" : "$7";  // after the campaign's hash and value
    const std::string provisional =
        " prov AS (SELECT least(q.offered_until, t.last_heartbeat + coalesce(t.holder_stale_s, 0) * interval '1 second')"
        " - now() AS left_for FROM " + q + " AS q, " + t + " AS t WHERE q.lock_name = $1 AND q.ticket = $4"
        " AND q.waiter_token = $3::bigint AND q.offered_fence IS NOT NULL AND q.waiter_pid = pg_backend_pid()"
        " AND t.locked = 1 AND t.lock_name = $1 AND t.instance_id = $2 AND t.grant_token = $3::bigint"
        " AND t.fence = q.offered_fence),"
        " unflushed AS (SELECT left_for FROM prov WHERE " + window + "::float8 >= 0"
        " AND left_for >= greatest(" + window + "::float8, 0.001) * interval '1 second'),";
    return "WITH" + provisional + " cfg AS (SELECT CASE WHEN EXISTS (SELECT 1 FROM unflushed)"
           " THEN set_config('synchronous_commit', 'off', true) ELSE " + std::string(forced_synchronous_commit) + " END,"
           " set_config('lock_timeout', $5, true), $6::text AS host),"
           " conf AS (UPDATE " + t + " AS t SET last_heartbeat = now() FROM cfg WHERE t.locked = 1 AND t.lock_name = $1"
           " AND t.instance_id = $2 AND t.grant_token = $3::bigint RETURNING t.fence),"
           " conf_out AS (DELETE FROM " + q + " AS q WHERE q.lock_name = $1 AND q.ticket = $4"
           " AND q.waiter_token = $3::bigint AND EXISTS (SELECT 1 FROM conf) RETURNING 1)" +
           (announce ? "," + announce->ctes : std::string()) +
           " SELECT (SELECT fence FROM conf), (SELECT count(*) FROM conf_out),"
           " (SELECT floor(extract(epoch FROM left_for) * 1000)::bigint FROM unflushed)" +
           (announce ? announce->columns : std::string());
  };
  s.confirm_offer = {"pgmutex_confirm_offer", confirm_offer_sql(nullptr)};
  const ElectionParts announce_confirmed = announce_with_grant(table, "SELECT fence FROM conf", "$8", "$7");
  s.election_confirm_offer = {"pgmutex_election_confirm_offer", confirm_offer_sql(&announce_confirmed)};

  // E: after the LISTEN. The waiter is bound to this connection's backend
  // (pid and start) when the pid the connection reported at start-up is
  // the server's own; behind a pooler it is not, and a lease keeps it.
  // ahead: rows in line before it (the statement's snapshot has not its own
  // row); try_now: the lock is free, stale or a lapsed offer; then whether
  // the place is bound to the backend, and the ms a standing offer it is
  // the runner-up of may still stand (NULL: none).
  s.enqueue = {
      "pgmutex_enqueue",
      "WITH " + std::string(procs_cte) + ","
      " cur AS (SELECT fence, coalesce(grant_token, 0) AS token, instance_id, " + std::string(stale_condition) +
      " AS stale FROM " + t + " WHERE locked = 1 AND lock_name = $1)," + offer_cte(q) +
      " ins AS (INSERT INTO " + q + " AS q (lock_name, waiter_token, instance_id, waiter_pid, waiter_started, lease_s,"
      " stale_s, handoff_s, holder_host, holder_pid, holder_command)"
      " SELECT $1, $4::bigint, $2, me.pid, (SELECT p.started FROM procs AS p WHERE p.pid = me.pid),"
      " $6::float8, $3::float8, $5::float8, nullif($8::text, ''), nullif($9::bigint, 0), nullif($10::text, '')"
      " FROM (SELECT CASE WHEN pg_backend_pid() = $7::int THEN pg_backend_pid() END AS pid) AS me"
      " RETURNING q.ticket, q.waiter_pid)"
      " SELECT ins.ticket, (SELECT count(*) FROM " + q + " AS a WHERE a.lock_name = $1),"
      " NOT EXISTS (SELECT 1 FROM cur) OR coalesce((SELECT stale FROM cur), false)"
      " OR coalesce((SELECT lapsed FROM off), false),"
      " ins.waiter_pid IS NOT NULL,"
      // An offer that stands with nobody live in line before us: we join
      // as its runner-up, whom no NOTIFY names: how long it may still stand
      // (ms), so that we look when it lapses (the queued try's watch).
      " (SELECT left_ms FROM off WHERE NOT off.lapsed AND NOT EXISTS (SELECT 1 FROM " + q + " AS a"
      " WHERE a.lock_name = $1 AND a.offered_fence IS NULL AND " + alive("a") + "))"
      " FROM ins"};

  // D: a place with no offer goes; an offered one is reported (its fence),
  // and the caller passes the offer on with the release. A place that goes
  // while an offer to a waiter ahead of it stands, with no live waiter
  // between them, was that offer's runner-up, the one waiter who looks when
  // the offer lapses (a frozen head): the next live waiter behind it is told
  // instead, in an offer's payload naming it the runner-up, with the ms the
  // offer may still stand (0 if it lapsed: its deadline passed). Otherwise
  // the line waited for its net look (its stale threshold) behind a frozen
  // head. A place another statement holds is not
  // named (SKIP LOCKED): one whose own dequeue runs (two waiters leaving at
  // once would name each other, and the next one be told by neither), or
  // one a release or queued try holds, which makes an offer of its own. The
  // dequeue locks no row before its place and waits for none after it: it
  // reads the lock row without locking it.
  //
  // A release that offers the lock to the head, naming us its runner-up,
  // as the dequeue runs (it locked our place, and our DELETE waited for it;
  // or it committed after our snapshot) made an offer the dequeue does not
  // see; and a waiter that joined the line as we left is in neither our
  // view nor, as our runner-up, told by its enqueue. So the dequeue also
  // says whether it may have missed either: it went, and it saw no standing
  // offer it was first behind, at most one live waiter not offered the lock
  // ahead of it and one behind it (whom such an offer would leave to be
  // named), or it saw such an offer and nobody to name. The caller then
  // sends the same check again in a statement of its own, whose snapshot
  // sees them (hand_on: $1 lock, $2 the ticket that went, $3 its token, only
  // typed, $4 the lock's hash). The one who leaves pays it: two statements
  // when it was the head or the runner-up of a line with someone behind it,
  // or the runner-up of a standing offer with nobody behind it; one alone
  // in line pays one.
  const std::string before_us = "q.lock_name = $1 AND q.ticket < $2 AND q.offered_fence IS NULL AND " + alive("q");
  const std::string behind_us = "q.lock_name = $1 AND q.ticket > $2 AND q.offered_fence IS NULL AND " + alive("q");
  const auto leaving_sql = [&](bool deletes) {
    const std::string gone = deletes ? " d AS (DELETE FROM " + q + " WHERE lock_name = $1 AND ticket = $2"
                                       " AND waiter_token = $3::bigint AND offered_fence IS NULL RETURNING ticket),"
                                     : " d AS (SELECT $2::bigint AS ticket WHERE $3::bigint IS NOT NULL),";
    const std::string told =
        "CASE WHEN EXISTS (SELECT 1 FROM heir) THEN " +
        notify_offer(table, "$4",
                     offer_payload("(SELECT fence FROM cur)", "(SELECT ticket FROM watched)", "(SELECT ticket FROM heir)",
                                   "(SELECT CASE WHEN lapsed THEN 0 ELSE greatest(left_ms, 0) END FROM watched)"),
                     "false", "SELECT waiter_pid FROM heir") +
        " ELSE 0 END";
    const std::string columns =
        deletes ? " SELECT EXISTS (SELECT 1 FROM d), (SELECT offered_fence FROM " + q +
                      " WHERE lock_name = $1 AND ticket = $2 AND waiter_token = $3::bigint), " + told + ","
                      " EXISTS (SELECT 1 FROM d) AND CASE WHEN EXISTS (SELECT 1 FROM watched)"
                      " THEN NOT EXISTS (SELECT 1 FROM heir) ELSE (SELECT count(*) FROM"
                      " (SELECT 1 FROM " + q + " AS q WHERE " + before_us + " LIMIT 2) AS ahead) < 2"
                      " AND EXISTS (SELECT 1 FROM " + q + " AS q WHERE " + behind_us + ") END"
                : " SELECT " + told;
    return "WITH " + std::string(procs_cte) + "," + gone +
           " cur AS (SELECT fence, coalesce(grant_token, 0) AS token, instance_id FROM " + t +
           " WHERE locked = 1 AND lock_name = $1)," + offer_cte(q) +
           " watched AS (SELECT off.* FROM off WHERE off.ticket < $2 AND EXISTS (SELECT 1 FROM d)"
           " AND NOT EXISTS (SELECT 1 FROM " + q + " AS q WHERE " + before_us + ")),"
           " heir AS (SELECT q.ticket, q.waiter_pid FROM " + q + " AS q, watched WHERE q.lock_name = $1"
           " AND q.ticket > $2 AND q.offered_fence IS NULL AND " + alive("q") +
           " ORDER BY q.ticket LIMIT 1 FOR KEY SHARE OF q SKIP LOCKED)" + columns;
  };
  s.dequeue = {"pgmutex_dequeue", leaving_sql(true)};
  s.hand_on = {"pgmutex_hand_on", leaving_sql(false)};

  // S: what `pgmutex status` shows of the queues.
  s.list_queue = {"pgmutex_list_queue",
                  "WITH " + std::string(procs_cte) + " SELECT q.lock_name, q.ticket, q.instance_id,"
                  " coalesce(q.holder_host, ''), coalesce(q.holder_pid, 0),"
                  " " + seconds_since("q.enqueued_at") + ", q.offered_fence IS NOT NULL, " + alive("q") +
                  " FROM " + q + " AS q ORDER BY q.lock_name, q.ticket"};
}

// The queue next to the lock table: one row per waiter, FIFO by ticket (an
// identity: no sequence GRANT needed). A waiter is alive while its
// connection's backend is (waiter_pid, waiter_started), or behind a pooler
// while its lease is fresh (last_seen, lease_s). An offer is the fence the
// head was given and how long it may take to confirm it.
std::string create_queue_sql(std::string_view table) {
  const TableName parts = parse_table_name(table).value();
  const std::string pkey = sql_identifier(derived_identifier("", parts.name, "_queue_pkey"));
  return "CREATE TABLE IF NOT EXISTS " + quoted_queue(table) + " (\n"
         "  lock_name      VARCHAR(64) NOT NULL,\n"
         "  ticket         BIGINT GENERATED ALWAYS AS IDENTITY,\n"
         "  waiter_token   BIGINT NOT NULL,\n"
         "  instance_id    VARCHAR(64) NOT NULL,\n"
         "  waiter_pid     INT,\n"
         "  waiter_started TIMESTAMPTZ,\n"
         "  enqueued_at    TIMESTAMPTZ NOT NULL DEFAULT now(),\n"
         "  last_seen      TIMESTAMPTZ NOT NULL DEFAULT now(),\n"
         "  lease_s        DOUBLE PRECISION NOT NULL,\n"
         "  stale_s        DOUBLE PRECISION NOT NULL,\n"
         "  handoff_s      DOUBLE PRECISION NOT NULL,\n"
         "  offered_fence  BIGINT,\n"
         "  offered_until  TIMESTAMPTZ,\n"
         "  holder_host    TEXT,\n"
         "  holder_pid     BIGINT,\n"
         "  holder_command TEXT,\n"
         "  CONSTRAINT " + pkey + " PRIMARY KEY (lock_name, ticket)\n"
         ") WITH (fillfactor = 70);\n";
}

std::string sql_queue_table(std::string_view table) {
  const TableName parts = parse_table_name(table).value();
  return sql_name(TableName{parts.schema, derived_identifier("", parts.name, "_queue")});
}

}  // namespace pgmutex::postgres_detail
