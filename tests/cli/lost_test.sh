#!/usr/bin/env bash
# A lost lease stops the command: SIGTERM, then SIGKILL after --grace; exit 70.
# Also release --force (it says whose lock it was) and crash recovery.
source "$(dirname "$0")/lib.sh" "$@"

expect 0 "schema" pgm schema
short=(--heartbeat-interval 0.2 --alert-threshold 1 --stale-threshold 3)

# start_holder LOCK GRACE SCRIPT
start_holder() {
  rm -f "$WORK/ready"
  "$PGMUTEX" run --table "$TABLE" --lock "$1" "${short[@]}" --grace "$2" -- sh -c "$3" "$WORK/ready" \
    >"$WORK/holder.out" 2>"$WORK/holder.err" &
  holder=$!
  background_pids+=("$holder")
  wait_for_file "$WORK/ready"
}

# --- the command obeys SIGTERM -----------------------------------------------
start_holder lost-term 10 "trap 'echo got-TERM; exit 0' TERM; echo \"\$PGMUTEX_INSTANCE \$PGMUTEX_FENCE\" >\"\$0\"; while :; do sleep 0.1; done"
read -r instance fence <"$WORK/ready"
expect 0 "release --force a held lock" pgm release --force lost-term
contains "$OUT" "released lock 'lost-term' held by $instance (fence $fence" "release --force says whose it was"
# The page's example line has the shape of the real one (docs/command/release.md).
shape() { sed -E 's/[0-9]+(\.[0-9]+)?/N/g; s/lock '"'"'[^'"'"']*'"'"'/lock L/; s/by [^ ]+ \(/by I (/; s/ on [^:]+: .*\)$/ on H: C)/' "$@"; }
documented=$(grep -m1 "^released lock '" "$(dirname "$0")/../../docs/command/release.md")
equal "$(shape <"$OUT")" "$(echo "$documented" | shape)" "release --force prints what docs/command/release.md shows"
start=$(now_ms)
wait_exit "$holder" 10; equal "$EXIT" "70" "lease lost: exit 70"
elapsed=$(($(now_ms) - start))
((elapsed < 3000)) && pass "the holder noticed within ${elapsed} ms" || fail "took ${elapsed} ms to notice"
contains "$WORK/holder.out" "got-TERM" "the command got SIGTERM"
contains "$WORK/holder.err" "lock 'lost-term' was lost" "pgmutex says the lock was lost"
contains "$WORK/holder.err" "ended after SIGTERM" "and that the command ended after SIGTERM"
# Stale 3 s leaves a 0.3 s safety margin: a 10 s grace cannot fit in it, and
# pgmutex says so with the numbers (10 s grace + the 0.1 s attempt that margin
# allows + the 0.2 s interval) and what would fit.
contains "$WORK/holder.err" "warning: the safety margin these thresholds leave (0.3 s) cannot cover --grace (10.0 s) + one heartbeat attempt (0.1 s) + --heartbeat-interval (0.2 s, heartbeats commit asynchronously) = 10.3 s" "a grace longer than the margin is flagged, with numbers"
contains "$WORK/holder.err" "lower --grace to 1.5 s or less, or raise --stale-threshold above 15.5 s" "and says which flag to change"
# Stale 60 s leaves room: the margin grows to cover the grace, and nothing is flagged.
expect 0 "a grace that fits the thresholds" pgm run --lock roomy --heartbeat-interval 1 --alert-threshold 5 --stale-threshold 60 --grace 10 -- true
lacks "$ERR" "warning" "no warning when the margin can cover the grace"

# --- the command ignores SIGTERM: SIGKILL after the grace ----------------------
start_holder lost-kill 1 "trap '' TERM; echo \$\$ >\"\$0\"; while :; do sleep 0.1; done"
shell_pid=$(cat "$WORK/ready")
expect 0 "release --force again" pgm release --force lost-kill
start=$(now_ms)
wait_exit "$holder" 10; equal "$EXIT" "70" "lease lost, TERM ignored: still exit 70"
elapsed=$(($(now_ms) - start))
((elapsed >= 1000 && elapsed < 4000)) && pass "SIGKILL came after the 1 s grace (${elapsed} ms)" ||
  fail "SIGKILL after ${elapsed} ms, wanted ~1 s grace"
[[ $(ps -o stat= -p "$shell_pid") == Z* || -z $(ps -o stat= -p "$shell_pid") ]] &&
  pass "the command is gone" || fail "the command survived SIGKILL"
contains "$WORK/holder.err" "killed with SIGKILL" "pgmutex says it killed the command"

# --- lost by a dead connection: the server ends the holder's session -----------
# The backend reconnects and keeps the lock (same fence): the command goes on.
start_holder lost-conn 10 "echo ready >\"\$0\"; sleep 2"
psql -X -q -At -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND datname = current_database() AND query ILIKE '%$TABLE%'" >/dev/null
wait_exit "$holder" 10; equal "$EXIT" "0" "a terminated connection alone does not lose the lock"

# --- release --force on a free lock ------------------------------------------
expect 0 "release --force a free lock" pgm release --force never-held
contains "$OUT" "was not held" "release says there was nothing to release"

# --- crash recovery: SIGKILL the holder, another instance reclaims -------------
start_holder crashed 10 "echo \$\$ >\"\$0\"; sleep 30"
shell_pid=$(cat "$WORK/ready")
kill -KILL "$holder"
wait "$holder" 2>/dev/null
expect 75 "right after the crash the lock is still taken" pgm run --lock crashed "${short[@]}" -- true
sleep 1.2
expect 75 "past the alert threshold: still taken" pgm run --lock crashed "${short[@]}" -- true
contains "$ERR" "past the alert threshold" "the contender sees the alert"
expect 0 "--wait reclaims once stale" pgm run --lock crashed "${short[@]}" --wait --timeout 10 -- echo reclaimed-and-ran
contains "$OUT" "reclaimed-and-ran" "the reclaimer ran its command"
contains "$ERR" "reclaimed stale lock 'crashed'" "the reclaimer says it took over a stale lock"

# The command died with pgmutex (its guard process killed the group): it did
# not run on beside the reclaimer. (A zombie awaiting its reaper counts as dead.)
running() { local state; state=$(ps -o stat= -p "$1" 2>/dev/null); [ -n "$state" ] && [[ "$state" != Z* ]]; }
if running "$shell_pid"; then fail "the command outlived the SIGKILLed pgmutex"; else pass "the command died with the SIGKILLed pgmutex"; fi
kill -KILL -- "-$shell_pid" 2>/dev/null  # should the check above have failed

# --- a lock held without a command: exit 70 when it is lost --------------------
mkfifo "$WORK/hold.in"
"$PGMUTEX" run --table "$TABLE" --lock lost-hold "${short[@]}" <"$WORK/hold.in" >"$WORK/hold.out" 2>"$WORK/hold.err" &
holder=$!
background_pids+=("$holder")
exec 7>"$WORK/hold.in"
wait_for_file "$WORK/hold.out"
expect 0 "release --force a lock held without a command" pgm release --force lost-hold
wait_exit "$holder" 10; equal "$EXIT" "70" "a lock held without a command and lost: exit 70"
contains "$WORK/hold.err" "lock 'lost-hold' was lost while it was held" "pgmutex says it was lost"
exec 7>&-

finish
