#!/usr/bin/env bash
# pgmutex run --wait in line (issue 17): 15 waiting runs get the lock in the
# order they queued, one after another; --handoff-deadline is accepted and
# checked against the lease; a waiter that times out leaves no place behind.
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

finish
