#!/usr/bin/env bash
# For cron: --quiet (no "taken" line, as flock -n; no warning for heartbeats
# retried across a server restart, which --metrics-file counts; --verbose
# tells each event), -E / --conflict-exit-code
# (as flock -E), --instance-id; the "taken" line names the holder's pid and
# command; names with control characters never reach the output raw.
source "$(dirname "$0")/lib.sh" "$@"

expect 0 "schema" pgm schema

"$PGMUTEX" run --table "$TABLE" --lock nightly --instance-id "web-3-cron" -- \
  sh -c 'echo "$PGMUTEX_INSTANCE" >"$0.tmp" && mv "$0.tmp" "$0"; sleep 30' "$WORK/holder" >/dev/null 2>&1 &
holder=$!
background_pids+=($holder)
wait_for_file "$WORK/holder"
equal "$(cat "$WORK/holder")" "web-3-cron" "--instance-id is the command's PGMUTEX_INSTANCE"

expect 75 "taken: 75" pgm run --lock nightly -- true
contains "$ERR" "held by web-3-cron (fence " "the taken line names the instance"
contains "$ERR" " ago, pid $holder on $(hostname): sh -c " "... and the holder's pid, host and command"
expect 75 "--quiet: still 75" pgm run --lock nightly --quiet -- true
equal "$(cat "$OUT" "$ERR")" "" "--quiet: nothing printed"
expect 0 "-E 0: taken is success" pgm run --lock nightly -E 0 -- true
expect 3 "--conflict-exit-code 3" pgm run --lock nightly --conflict-exit-code 3 -- true
contains "$ERR" "is held by web-3-cron" "-E alone still prints the line"
expect 1 "-E 1 --quiet, as flock -n -E 1" pgm run --lock nightly -E 1 --quiet -- true
equal "$(cat "$OUT" "$ERR")" "" "silent"
expect 9 "-E applies to --wait --timeout too" pgm run --lock nightly --wait --timeout 0.5 -E 9 -- true
expect 0 "a free lock: the command's own code" pgm run --lock other -E 9 --quiet -- true
for bad in 256 -1 x; do
  expect 64 "-E $bad: usage error" pgm run --lock nightly -E "$bad" -- true
done
contains "$ERR" "conflict-exit-code" "the usage error names the flag"
expect 64 "--instance-id longer than 64: usage error" pgm run --lock a --instance-id "$(printf 'i%.0s' {1..65})" -- true
contains "$ERR" "--instance-id" "names the flag"
kill -TERM "$holder"
wait_exit "$holder" 20

# A command word that is not UTF-8 is recorded with '?' for its odd bytes: the
# acquire must not fail on it.
expect 0 "a Latin-1 argument: the command still runs" pgm run --lock latin -- true $'caf\xe9'

# --- control characters are escaped in every output ----------------------------------
evil=$'evil\nFORGED LINE\e[31m'
"$PGMUTEX" run --table "$TABLE" --lock "$evil" --instance-id $'id\tx' -- \
  sh -c 'echo x >"$0"; sleep 30' "$WORK/evil" >/dev/null 2>&1 &
evil_holder=$!
background_pids+=($evil_holder)
wait_for_file "$WORK/evil" || true
sleep 0.2
expect 75 "taken: an evil name" pgm run --lock "$evil" -- true
equal "$(line_count "$ERR")" "1" "the taken line stays one line"
contains "$ERR" 'evil\nFORGED LINE\x1b[31m' "the name is escaped"
contains "$ERR" 'id\tx' "the instance is escaped"
expect 0 "status" pgm status
lacks "$OUT" $'\e' "status text: no raw escape"
equal "$(grep -c '^FORGED' "$OUT")" "0" "status text: no forged line"
contains "$OUT" 'evil\nFORGED LINE\x1b[31m' "status text: the name is escaped"
expect 0 "status --json" pgm status --json
equal "$(jq -r '.locks[0].lock' "$OUT")" "$evil" "json keeps the exact name (JSON escapes it)"
expect 0 "status --check" pgm status --check "$evil"
equal "$(line_count "$OUT")" "1" "--check: one line"
lacks "$OUT" $'\e' "--check: no raw escape"

# --- heartbeats retried across a restart: --quiet prints nothing --------------
# The fault proxy resets every connection, new ones too, for a second (the
# server restarting), then lets them through: each heartbeat in between fails
# and is retried, the lease survives, and the command ends well.
start_fault_proxy
through_restart() {  # NAME FLAGS...: a 3 s command; the proxy resets for 1 s in the middle
  local name=$1
  shift
  "$PGMUTEX" run --table "$TABLE" --dsn "host=127.0.0.1 port=$proxy_port" --lock "restart-$name" \
    --heartbeat-interval 0.2 --alert-threshold 1 --stale-threshold 8 --metrics-file "$WORK/$name.prom" "$@" \
    -- sh -c 'echo go >"$0"; sleep 3' "$WORK/$name.started" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  local pid=$!
  background_pids+=("$pid")
  wait_for_file "$WORK/$name.started"
  sleep 0.5
  proxy_mode reset
  sleep 1
  proxy_mode pass
  wait_exit "$pid" 30
}
retries() { grep -E '^pgmutex_run_heartbeat_retries\{' "$1" | awk '{print $NF}'; }

through_restart quiet -q -E 0
equal "$EXIT" "0" "--quiet across a restart: the command's exit code"
equal "$(cat "$WORK/quiet.out" "$WORK/quiet.err")" "" "--quiet across a restart: nothing printed, so cron mails nothing"
[[ "$(retries "$WORK/quiet.prom")" =~ ^[1-9][0-9]*$ ]] && pass "--metrics-file counts the retried heartbeats ($(retries "$WORK/quiet.prom"))" ||
  fail "no retried heartbeats counted: $(cat "$WORK/quiet.prom")"

through_restart verbose -v
equal "$EXIT" "0" "--verbose across a restart: the command's exit code"
contains "$WORK/verbose.err" "pgmutex: acquired lock 'restart-verbose' (fence " "--verbose: the grant, with its fence"
contains "$WORK/verbose.err" "failed, retrying" "--verbose: each failed heartbeat"
contains "$WORK/verbose.err" "pgmutex: heartbeat for lock 'restart-verbose' recovered after " "--verbose: the recovery"
contains "$WORK/verbose.err" "pgmutex: released lock 'restart-verbose'" "--verbose: the release"
expect 64 "--quiet and --verbose together: usage error" pgm run --lock x -q -v -- true

finish
