#!/usr/bin/env bash
# pgmutex run --wait in line (issue 17): 15 waiting runs get the lock in the
# order they queued, one after another; --handoff-deadline is accepted and
# checked against the lease; a waiter that times out leaves no place behind;
# a waiter facing a frozen holder's longer threshold does not spin.
source "$(dirname "$0")/lib.sh" "$@"

queued() { psql -X -At -c "SELECT count(*) FROM ${TABLE}_queue" 2>/dev/null; }
# wait_queued N: until N runs wait in line (fails the check after 20 s).
wait_queued() {
  local waited=0
  while [[ "$(queued)" != "$1" ]]; do
    sleep 0.05
    waited=$((waited + 1))
    if ((waited > 400)); then
      fail "timed out waiting for $1 queued (have $(queued))"
      return 1
    fi
  done
}

expect 0 "schema" pgm schema
expect 0 "--handoff-deadline is accepted" pgm run --lock flag --handoff-deadline 0.5 -- true
expect 64 "--handoff-deadline beyond the lease is refused: 64" pgm run --lock flag --handoff-deadline 10000 -- true
contains "$ERR" "--handoff-deadline (10000s) must be <=" "names the option and its rule"

# A holder, then 15 waiters, each started once the one before it is in line.
"$PGMUTEX" run --table "$TABLE" --lock line -- sh -c "echo x >'$WORK/held'; while [ ! -e '$WORK/go' ]; do sleep 0.05; done" &
background_pids+=($!)
holder=$!
wait_for_file "$WORK/held"
waiters=()
for i in $(seq 1 15); do
  "$PGMUTEX" run --table "$TABLE" --lock line --wait --timeout 120 -- sh -c "echo $i >>'$WORK/order'; echo \$PGMUTEX_FENCE >>'$WORK/fences'" &
  background_pids+=($!)
  waiters+=($!)
  wait_queued "$i"
done
touch "$WORK/go"
wait_exit "$holder" 30
equal "$EXIT" "0" "the holder exits 0"
for pid in "${waiters[@]}"; do
  wait_exit "$pid" 120
  [[ "$EXIT" == 0 ]] || fail "a waiter exited $EXIT"
done
equal "$(tr '\n' ' ' <"$WORK/order")" "$(seq 1 15 | tr '\n' ' ')" "granted in arrival order"
sort -n -c "$WORK/fences" 2>/dev/null && [[ "$(sort -nu "$WORK/fences" | wc -l)" == 15 ]] &&
  pass "fences strictly increase along the line" || fail "fences: $(tr '\n' ' ' <"$WORK/fences")"
equal "$(queued)" "0" "nobody left in line"

# A waiter that times out leaves no place behind.
"$PGMUTEX" run --table "$TABLE" --lock gone -- sh -c "echo x >'$WORK/held2'; sleep 30" &
background_pids+=($!)
holder=$!
wait_for_file "$WORK/held2"
expect 75 "a waiter that times out: 75" pgm run --lock gone --wait --timeout 0.5 -- true
equal "$(queued)" "0" "... and leaves no place in line"
# So does one stopped by SIGTERM while it waits.
"$PGMUTEX" run --table "$TABLE" --lock gone --wait -- true &
background_pids+=($!)
waiter=$!
wait_queued 1
kill -TERM "$waiter"
wait_exit "$waiter" 30
[[ "$EXIT" != 0 && "$EXIT" != 255 ]] && pass "a waiter stopped by SIGTERM exits ($EXIT)" || fail "SIGTERMed waiter: exit $EXIT"
equal "$(queued)" "0" "... and leaves no place in line"
kill -TERM "$holder"
wait_exit "$holder" 30

# A frozen holder that stored a longer stale threshold (60 s) than its
# waiter's (2 s): past 2 s the row is older than the waiter's threshold yet
# not stale, and the waiter looks again one threshold later, not at once (it
# once spun: 1,500 statements a second). Counted in a database of its own,
# so that no other test's transactions are counted.
db="${PGDATABASE}_spin_$$"
psql -X -q -c "CREATE DATABASE \"$db\"" >/dev/null
commits() { PGDATABASE=$db psql -X -At -c "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"; }
PGDATABASE=$db "$PGMUTEX" schema --table "$TABLE" >/dev/null 2>&1 && pass "schema in a database of its own" ||
  fail "schema in $db"
PGDATABASE=$db "$PGMUTEX" run --table "$TABLE" --lock frozen --stale-threshold 60 --alert-threshold 30 -- \
  sh -c 'echo $$ >"$0.tmp" && mv "$0.tmp" "$0"; exec sleep 60' "$WORK/frozen-held" >/dev/null 2>&1 &
frozen=$!
background_pids+=("$frozen")
wait_for_file "$WORK/frozen-held"
kill -STOP "$frozen"
PGDATABASE=$db "$PGMUTEX" run --table "$TABLE" --lock frozen --wait --timeout 30 --stale-threshold 2 \
  --alert-threshold 1 -- true >/dev/null 2>&1 &
waiter=$!
background_pids+=("$waiter")
sleep 3  # past the waiter's threshold
before=$(commits)
sleep 3
spent=$(( $(commits) - before ))
((spent < 20)) && pass "a waiter past its threshold, facing a longer one, does not spin ($spent transactions in 3 s)" ||
  fail "the waiter spun: $spent transactions in 3 s"
kill -KILL "$waiter" "$frozen" "$(cat "$WORK/frozen-held")" 2>/dev/null
wait "$waiter" "$frozen" 2>/dev/null
psql -X -q -c "DROP DATABASE \"$db\" WITH (FORCE)" >/dev/null

finish
