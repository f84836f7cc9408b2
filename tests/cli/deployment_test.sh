#!/usr/bin/env bash
# pgmutex through a real pgbouncer (run under tests/tools/with-pgbouncer, once
# per pool mode): schema, run, run --wait, status, release --force, in the
# automatic statement mode and with --statement-mode unnamed; and as a role
# with only the lock's privileges (straight to the server): everything but
# schema works, schema exits 77 naming the GRANT.
source "$(dirname "$0")/lib.sh" "$@"

if [[ -z "${PGMUTEX_TEST_PGBOUNCER_DSN:-}" ]]; then
  echo "FAIL [$TEST_NAME]: PGMUTEX_TEST_PGBOUNCER_DSN is not set: run under tests/tools/with-pgbouncer" >&2
  exit 1
fi
MODE=$PGMUTEX_TEST_PGBOUNCER_MODE

# --- through pgbouncer -------------------------------------------------------
for statements in auto unnamed; do
  export PGMUTEX_DSN="$PGMUTEX_TEST_PGBOUNCER_DSN" PGMUTEX_STATEMENT_MODE=$statements
  what="pgbouncer $MODE, $statements"
  expect 0 "$what: schema" pgm schema
  expect 0 "$what: run" pgm run --lock job -- sh -c 'echo "$PGMUTEX_FENCE"'
  fence=$(cat "$OUT")
  [[ "$fence" =~ ^[0-9]+$ ]] && pass "$what: the child saw its fence ($fence)" || fail "$what: fence '$fence'"

  # A holder, heartbeating every 0.1 s; a second run exits 75; status shows it.
  "$PGMUTEX" run --table "$TABLE" --lock busy --heartbeat-interval 0.1 -- \
    sh -c 'echo "$PGMUTEX_INSTANCE" >"$0.tmp" && mv "$0.tmp" "$0"; while [ ! -e "$0.stop" ]; do sleep 0.05; done' \
    "$WORK/holder-$statements" >/dev/null 2>"$WORK/holder.err" &
  holder=$!
  background_pids+=("$holder")
  wait_for_file "$WORK/holder-$statements"
  instance=$(cat "$WORK/holder-$statements")
  expect 75 "$what: a second run while held" pgm run --lock busy -- true
  contains "$ERR" "held by $instance" "$what: names the holder"
  expect 0 "$what: status" pgm status busy --json
  equal "$(jq -r '.locks[0].instance + " " + .locks[0].state' "$OUT")" "$instance ok" "$what: status shows the holder"

  # run --wait: blocks until the holder is done (a release, seen by LISTEN or by polling).
  "$PGMUTEX" run --table "$TABLE" --lock busy --wait --timeout 60 -- sh -c '[ -e "$0.stop" ] && echo after || echo overlap' \
    "$WORK/holder-$statements" >"$WORK/waiter.out" 2>"$WORK/waiter.err" &
  waiter=$!
  background_pids+=("$waiter")
  sleep 0.5
  touch "$WORK/holder-$statements.stop"
  wait_exit "$holder" 20
  equal "$EXIT" "0" "$what: the holder exited 0"
  wait_exit "$waiter" 60
  equal "$EXIT" "0" "$what: the waiter ran after the release"
  equal "$(cat "$WORK/waiter.out")" "after" "$what: only after the holder was done"

  # release --force takes a held lock away.
  "$PGMUTEX" run --table "$TABLE" --lock forced --heartbeat-interval 0.1 -- \
    sh -c 'echo up >"$0"; sleep 30' "$WORK/forced-$statements" >/dev/null 2>&1 &
  forced=$!
  background_pids+=("$forced")
  wait_for_file "$WORK/forced-$statements"
  expect 0 "$what: release --force" pgm release --force forced
  wait_exit "$forced" 30
  equal "$EXIT" "70" "$what: the holder found its lock lost (70)"
  expect 0 "$what: status after" pgm status forced
  contains "$OUT" "is not held" "$what: the lock is free"
done
unset PGMUTEX_DSN PGMUTEX_STATEMENT_MODE

# --statement-mode prepared is refused by a transaction pooler only when the
# statement meets another server connection: that case is in the library
# tests (postgres_pgbouncer_transaction), where it is made certain.

# --- least privilege (straight to the server) ------------------------------------
role="cli_least_$$"
psql -X -q -v ON_ERROR_STOP=1 -c "CREATE ROLE $role LOGIN" >/dev/null || fail "cannot create role $role"
expect 0 "owner: schema" pgm schema
expect 0 "owner: another table, no grants on it" "$PGMUTEX" schema --table "${TABLE}_other"
psql -X -q -v ON_ERROR_STOP=1 -c "GRANT SELECT, INSERT, UPDATE, DELETE ON $TABLE, ${TABLE}_queue TO $role" \
  -c "GRANT USAGE ON SEQUENCE ${TABLE}_fence_seq TO $role" >/dev/null || fail "cannot grant $role"
export PGMUTEX_DSN="user=$role"
expect 0 "least privilege: run" pgm run --lock least -- true
expect 0 "least privilege: status" pgm status --json
"$PGMUTEX" run --table "$TABLE" --lock least --heartbeat-interval 0.2 -- sh -c 'echo up >"$0"; sleep 30' "$WORK/least" >/dev/null 2>&1 &
least=$!
background_pids+=("$least")
wait_for_file "$WORK/least"
expect 0 "least privilege: release --force" pgm release --force least
wait_exit "$least" 30
equal "$EXIT" "70" "least privilege: the holder found its lock lost"
expect 77 "least privilege: schema without CREATE exits 77" pgm schema
contains "$ERR" "lacks CREATE on schema public" "schema: names the missing privilege"
contains "$ERR" "GRANT CREATE ON SCHEMA public TO $role" "schema: names the GRANT"
expect 77 "least privilege: status of a table without grants exits 77" "$PGMUTEX" status --table "${TABLE}_other"
contains "$ERR" "GRANT SELECT ON ${TABLE}_other, ${TABLE}_other_queue TO $role" "status: names the GRANT a reader needs"
unset PGMUTEX_DSN

finish
