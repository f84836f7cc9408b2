#!/bin/bash
# benchmarks/queue/release_first_execution.sh [PGMUTEX_BINARY]   (run under scripts/with-postgres)
#
# How long `pgmutex run`'s release statement takes on the server the first time a backend
# executes it, against the next times. A CLI holder's connection runs its release once, right
# after planning it while it waited (EXPLAIN EXECUTE with NULLs, force_generic_plan), so the
# handoff pays the first execution. This sets up a holder and six `pgmutex run --wait` waiters,
# lets the holder go (the server log gives the release's text), then in two fresh psql sessions
# plans the statement as the CLI does and runs it for real on the new holder's key, each time in
# a transaction rolled back: five times in the first session; in the second, once with a key that
# matches no row first (a warm-up that writes nothing), then three times.
#
#   scripts/with-postgres benchmarks/queue/release_first_execution.sh build-test/tools/pgmutex
set -euo pipefail
pgmutex=$(realpath "${1:-build-test/tools/pgmutex}")
dsn="host=127.0.0.1 port=$PGPORT dbname=postgres user=postgres"
log="$(dirname "$PGMUTEX_TEST_PGDATA")/server.log"
work=$(mktemp -d)
trap 'pkill -f -- "--lock first-exec" || true; sleep 1; pkill -9 -f -- "--lock first-exec" || true; rm -rf "$work"' EXIT
"$pgmutex" schema --dsn "$dsn" >/dev/null
"$pgmutex" run --lock first-exec --dsn "$dsn" --quiet -- sleep 1000 >/dev/null 2>&1 &
holder=$!
sleep 1
for _ in 1 2 3 4 5 6; do "$pgmutex" run --lock first-exec --wait --dsn "$dsn" --quiet -- sleep 1000 >/dev/null 2>&1 & done
sleep 3
psql -XAtq -d postgres -c "ALTER SYSTEM SET log_min_duration_statement = 0" -c "SELECT pg_reload_conf()" >/dev/null
sleep 1
kill -TERM "$holder"
sleep 3
psql -XAtq -d postgres -c "ALTER SYSTEM RESET log_min_duration_statement" -c "SELECT pg_reload_conf()" >/dev/null
grep -o "execute pgmutex_release[^:]*: WITH procs.*" "$log" | head -1 | sed 's/^execute [^:]*: //' >"$work/release.sql"
[[ -s "$work/release.sql" ]] || { echo "release_first_execution: no release in $log" >&2; exit 1; }
read -r instance fence token <<<"$(psql -XAtq -F ' ' -d postgres -c \
  "SELECT instance_id, fence, grant_token FROM mutex_lock WHERE lock_name = 'first-exec' AND locked = 1")"
run="BEGIN; EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON) EXECUTE r('first-exec', '$instance', $fence, $token, 'x', '5s'); ROLLBACK;"
session() {  # session WARM-UP-FIRST COUNT
  {
    echo "SET plan_cache_mode = force_generic_plan;"
    echo "PREPARE r AS $(cat "$work/release.sql");"
    echo "EXPLAIN (COSTS OFF) EXECUTE r(NULL, NULL, NULL, NULL, NULL, NULL);"
    [[ $1 == no ]] || echo "BEGIN; EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON) EXECUTE r('first-exec', 'nobody', -1, 0, 'x', '5s'); ROLLBACK;"
    for _ in $(seq "$2"); do echo "$run"; done
  } | psql -X -q -d postgres 2>&1 | awk '/Execution Time/ {print $3}' | paste -sd' '
}
echo "release, ms of execution, one fresh session each (a rolled-back transaction each):"
echo "  planned, then the real key 5 times:                $(session no 5)"
echo "  planned, a key matching nothing, then 3 real ones: $(session yes 3)"
