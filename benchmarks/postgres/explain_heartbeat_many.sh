#!/usr/bin/env bash
# EXPLAIN (ANALYZE, BUFFERS, WAL) of the heartbeat batch on a 1,000-row lock
# table: what the server spends on one round, and how many updates are HOT.
# The statement is sql.cpp's heartbeat_many (plain) or its skip-locked form,
# prepared as the backend prepares it, explained 15 times after 8 batches;
# figures in BENCHMARKS.md, Sessions.
#
#   scripts/with-postgres benchmarks/postgres/explain_heartbeat_many.sh [FILLFACTOR] [plain|skip]
set -euo pipefail
ff=${1:-50}
variant=${2:-plain}
t="explain_hb_$$"
keys="unnest(\$1::text[], \$2::text[], \$3::bigint[], \$4::bigint[]) WITH ORDINALITY AS k(lock_name, instance_id, fence, token, i)"
cfg="(SELECT set_config('lock_timeout', \$5, true), set_config('synchronous_commit', 'off', true)) AS cfg"
match="WHERE t.locked = 1 AND t.lock_name = k.lock_name AND t.instance_id = k.instance_id AND t.fence = k.fence AND coalesce(t.grant_token, 0) = k.token"
if [[ $variant == skip ]]; then
  stmt="WITH mine AS (SELECT t.lock_name, k.i FROM $t AS t, $keys, $cfg $match FOR UPDATE OF t SKIP LOCKED) UPDATE $t AS t SET last_heartbeat = now() FROM mine WHERE t.locked = 1 AND t.lock_name = mine.lock_name RETURNING mine.i"
else
  stmt="UPDATE $t AS t SET last_heartbeat = now() FROM $keys, $cfg $match RETURNING k.i"
fi
run="EXECUTE hb(:'n', :'i', :'f', :'tk', '5s');"
# The 9th to 23rd batches are explained: execution time min and median (the
# VM's other load makes single times noisy), WAL records and bytes of each.
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
psql -X -q -v ON_ERROR_STOP=1 >"$tmp" <<SQL
CREATE TABLE $t (
  lock_name VARCHAR(64) NOT NULL, locked INT NOT NULL DEFAULT 1, instance_id VARCHAR(64) NOT NULL,
  last_heartbeat TIMESTAMPTZ NOT NULL, acquired_at TIMESTAMPTZ NOT NULL, fence BIGINT NOT NULL,
  grant_token BIGINT, holder_stale_s DOUBLE PRECISION, holder_host TEXT, holder_pid BIGINT, holder_command TEXT,
  CONSTRAINT uq_$t UNIQUE (locked, lock_name), CONSTRAINT chk_locked CHECK (locked = 1)) WITH (fillfactor = $ff);
INSERT INTO $t (lock_name, instance_id, last_heartbeat, acquired_at, fence, grant_token, holder_stale_s,
                holder_host, holder_pid, holder_command)
  SELECT 'lock-' || g, 'me', now(), now(), g, 7, 600, 'somehost.example', 12345, '/usr/bin/some-command --with args'
  FROM generate_series(0, 999) AS g;
SELECT array_agg(lock_name) n, array_agg(instance_id) i, array_agg(fence) f, array_agg(grant_token) tk FROM $t \gset
PREPARE hb(text[], text[], bigint[], bigint[], text) AS $stmt;
\o /dev/null
$run $run $run $run $run $run $run $run
\o
$(for _ in $(seq 15); do echo "EXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF) $run"; done)
SELECT pg_sleep(1.1);  -- the statistics reach pg_stat_user_tables within a second
SELECT n_tup_upd AS updates, n_tup_hot_upd AS hot FROM pg_stat_user_tables WHERE relname = '$t';
DROP TABLE $t;
SQL
out=$(cat "$tmp")
times=$(grep 'Execution Time' <<<"$out" | awk '{ print $3 }' | sort -n)
echo "fillfactor $ff, $variant: batches 9-23: execution min $(head -n 1 <<<"$times") ms," \
  "median $(sed -n 8p <<<"$times") ms; per batch $(grep '^   WAL:' <<<"$out" | tail -n 1 | sed 's/^ *//');" \
  "after 23 batches: $(grep -E '^ *[0-9]+ \| *[0-9]+ *$' <<<"$out" | awk '{ print $1 " updates, " $3 " HOT" }')"
