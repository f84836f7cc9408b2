#!/usr/bin/env bash
# pgmutex run: contention, waiting, exit codes, the child's environment.
source "$(dirname "$0")/lib.sh" "$@"

expect 78 "run before the table exists: 78 (EX_CONFIG)" pgm run --lock early -- true
contains "$ERR" "create or upgrade it with: pgmutex schema --table '$TABLE'" "says how to fix it"
equal "$(line_count "$ERR")" "1" "in one line"
expect 0 "schema creates the table" pgm schema
contains "$OUT" "$TABLE" "schema names the table"
expect 0 "schema again (idempotent)" pgm schema

# --- exit codes pass through ---------------------------------------------
expect 0 "command exit 0" pgm run --lock codes -- true
expect 3 "command exit 3 passes through" pgm run --lock codes -- sh -c 'exit 3'
expect 127 "command not found: 127" pgm run --lock codes -- /nonexistent/command
contains "$ERR" "/nonexistent/command: command not found" "not found is named"
expect 127 "command not in PATH: 127" pgm run --lock codes -- no-such-command-pgmutex
printf 'echo hi\n' >"$WORK/not-executable"
expect 126 "command not executable: 126" pgm run --lock codes -- "$WORK/not-executable"
contains "$ERR" "cannot execute" "not executable is named"
# Found on PATH as execvpe finds it (looked up while waiting, exec'd at the
# grant): the first folder that has it, a script without #! run by sh, and
# one that moved away meanwhile found again where it is at the grant.
mkdir -p "$WORK/path-a" "$WORK/path-b"
printf 'echo from-a\n' >"$WORK/path-a/pgmutex-test-cmd"
printf 'echo from-b\n' >"$WORK/path-b/pgmutex-test-cmd"
chmod +x "$WORK/path-a/pgmutex-test-cmd" "$WORK/path-b/pgmutex-test-cmd"
expect 0 "a command found on PATH, no #!" env PATH="$WORK/path-a:$WORK/path-b:$PATH" "$PGMUTEX" run --table "$TABLE" --lock codes -- pgmutex-test-cmd
equal "$(cat "$OUT")" "from-a" "PATH's first folder with it wins, and sh runs a script without #!"
"$PGMUTEX" run --table "$TABLE" --lock path -- sh -c 'echo held >"$1"; while [ ! -e "$0" ]; do sleep 0.02; done' \
  "$WORK/path-go" "$WORK/path-held" >/dev/null 2>&1 &
path_holder=$!
background_pids+=("$path_holder")
wait_for_file "$WORK/path-held"
env PATH="$WORK/path-a:$WORK/path-b:$PATH" "$PGMUTEX" run --table "$TABLE" --lock path --wait -- pgmutex-test-cmd \
  >"$WORK/path-out" 2>&1 &
path_waiter=$!
background_pids+=("$path_waiter")
sleep 0.5
rm "$WORK/path-a/pgmutex-test-cmd"  # found there before the wait: gone at the grant
touch "$WORK/path-go"
wait_exit "$path_waiter" 10
equal "$EXIT" "0" "a command that moved while pgmutex waited runs"
equal "$(cat "$WORK/path-out")" "from-b" "it is looked for again at the grant"
wait_exit "$path_holder" 10
expect 0 "the lock is free after a failed spawn" pgm status codes
contains "$OUT" "is not held" "status after failed spawn"
expect 137 "killed by SIGKILL: 128+9" pgm run --lock codes -- sh -c 'kill -KILL $$'
expect 0 "the lock is free after the command ended" pgm status codes
contains "$OUT" "is not held" "released when the command ends"
expect 0 "stdout of the command passes through" pgm run --lock codes -- echo hello-from-child
contains "$OUT" "hello-from-child" "child stdout"

# --- the child's environment ---------------------------------------------
env_dump() { pgm run --lock env-lock -- sh -c 'echo "$PGMUTEX_LOCK|$PGMUTEX_FENCE|$PGMUTEX_INSTANCE|$KEEP_ME"'; }
PGMUTEX_FENCE=stale-value KEEP_ME=kept env_dump >"$OUT" 2>"$ERR"
IFS='|' read -r lock fence instance kept <"$OUT"
equal "$lock" "env-lock" "PGMUTEX_LOCK is the lock name"
[[ "$fence" =~ ^[0-9]+$ ]] && pass "PGMUTEX_FENCE is a number ($fence)" || fail "PGMUTEX_FENCE '$fence' is not a number"
[[ -n "$instance" && "$instance" == "$(hostname)"* ]] && pass "PGMUTEX_INSTANCE names this host ($instance)" ||
  fail "PGMUTEX_INSTANCE '$instance'"
equal "$kept" "kept" "the rest of the environment is passed on"
KEEP_ME=kept env_dump >"$OUT" 2>"$ERR"
IFS='|' read -r _ fence2 instance2 _ <"$OUT"
((fence2 > fence)) && pass "the fence grows between grants ($fence < $fence2)" || fail "fence $fence then $fence2"
[[ "$instance2" != "$instance" ]] && pass "each run is its own instance" || fail "instance reused: $instance2"

# --- two runs on one lock: the second exits 75 at once -------------------
# The holder holds until told ($WORK/holder.go), not for a fixed time: under
# ThreadSanitizer the five refused runs below once outlasted a 4 s hold.
"$PGMUTEX" run --table "$TABLE" --lock busy -- \
  sh -c 'echo "$PGMUTEX_INSTANCE" >"$0.tmp" && mv "$0.tmp" "$0"; while [ ! -e "$0.go" ]; do sleep 0.05; done; touch "$0.done"' \
  "$WORK/holder" \
  >/dev/null 2>"$WORK/holder.err" &
holder=$!
background_pids+=("$holder")
wait_for_file "$WORK/holder"
holder_instance=$(cat "$WORK/holder")
start=$(now_ms)
expect 75 "second run exits 75 while the lock is held" pgm run --lock busy -- touch "$WORK/second-ran"
elapsed=$(($(now_ms) - start))
((elapsed < 3000)) && pass "it does not wait (${elapsed} ms)" || fail "exit 75 took ${elapsed} ms"
[[ ! -e "$WORK/second-ran" ]] && pass "the second command did not run" || fail "the second command ran"
equal "$(line_count "$ERR")" "1" "one line on stderr"
contains "$ERR" "lock 'busy' is held by $holder_instance" "the line names the holder"
matches "$ERR" "last heartbeat [0-9]+\.[0-9] s ago" "the line gives seconds since heartbeat"

# --wait --timeout: gives up with 75 after the timeout.
start=$(now_ms)
expect 75 "--wait --timeout 1 while held: 75" pgm run --lock busy --wait --timeout 1 -- touch "$WORK/second-ran"
elapsed=$(($(now_ms) - start))
((elapsed >= 900 && elapsed < 3500)) && pass "gave up after ~1 s (${elapsed} ms)" || fail "timeout took ${elapsed} ms"
contains "$ERR" "still held after waiting 1.0 s by $holder_instance" "timeout line names the holder"
[[ ! -e "$WORK/second-ran" ]] && pass "the command did not run after the timeout" || fail "command ran after timeout"

# flock habits: -w S waits up to S seconds, --timeout alone implies --wait,
# -n does not wait (the default, spelled as flock spells it).
expect 75 "-w 1 while held: 75" pgm run --lock busy -w 1 -- touch "$WORK/second-ran"
contains "$ERR" "still held after waiting 1.0 s by $holder_instance" "-w 1 waited, as --wait --timeout 1"
expect 75 "--timeout 1 without --wait while held: 75" pgm run --lock busy --timeout 1 -- touch "$WORK/second-ran"
contains "$ERR" "still held after waiting 1.0 s by $holder_instance" "--timeout implies --wait"
expect 75 "-n while held: 75" pgm run --lock busy -n -- touch "$WORK/second-ran"
contains "$ERR" "lock 'busy' is held by $holder_instance" "-n exits at once, naming the holder"
[[ ! -e "$WORK/second-ran" ]] && pass "no command ran under -w, --timeout or -n" || fail "a command ran while the lock was held"

# --wait: runs once the holder is done, and only then (told to end a second
# after the waiter starts).
(sleep 1; touch "$WORK/holder.go") &
background_pids+=($!)
expect 0 "--wait runs after the holder ends" \
  pgm run --lock busy --wait -- sh -c '[ -e "$0" ] && echo after || echo overlap' "$WORK/holder.done"
equal "$(cat "$OUT")" "after" "the waiter ran only after the holder exited"
wait_exit "$holder" 10; equal "$EXIT" "0" "the holder exited 0"

# --- several start at once: one runs, every other names that one -----------
for round in 1 2 3; do
  racers=()
  for i in 1 2 3 4; do
    "$PGMUTEX" run --table "$TABLE" --lock race-$round -- sh -c 'echo "$PGMUTEX_INSTANCE" >"$0"; sleep 1' \
      "$WORK/race-$round.$i" >/dev/null 2>"$WORK/race-$round.$i.err" &
    racers+=($!)
  done
  codes=""
  for i in 1 2 3 4; do
    wait_exit "${racers[$((i - 1))]}" 10
    codes+="$EXIT "
  done
  equal "$(tr ' ' '\n' <<<"$codes" | sort | tr '\n' ' ')" " 0 75 75 75 " "round $round: one of four ran, three exited 75"
  winner_instance=$(cat "$WORK"/race-$round.? 2>/dev/null)
  named=$(grep -lF "is held by $winner_instance (fence" "$WORK"/race-$round.?.err | wc -l)
  equal "$named" "3" "round $round: each loser named the winner ($winner_instance)"
done

# --- mutual exclusion under contention -----------------------------------
# Four waiters, each appending start/end marks: no two holds may interleave.
for i in 1 2 3 4; do
  "$PGMUTEX" run --table "$TABLE" --lock crowd --wait --timeout 30 -- sh -c 'echo "start $0" >>"$1"; sleep 0.3; echo "end $0" >>"$1"' \
    "$i" "$WORK/crowd.log" >/dev/null 2>&1 &
  background_pids+=($!)
done
crowd_ok=1
for pid in "${background_pids[@]: -4}"; do
  wait_exit "$pid" 30; [[ $EXIT -eq 0 ]] || crowd_ok=0
done
equal "$crowd_ok" "1" "four waiters all ran"
awk '$1=="start"{if(open!="")bad=1; open=$2} $1=="end"{if(open!=$2)bad=1; open=""} END{exit bad}' "$WORK/crowd.log" &&
  pass "no two holds overlapped" || fail "holds overlapped: $(cat "$WORK/crowd.log")"
equal "$(grep -c start "$WORK/crowd.log")" "4" "four holds recorded"

# --- no command: hold the lock, as etcdctl lock NAME ---------------------------
expect 0 "no command, stdin at its end: prints the fence, releases" pgm run --lock hold </dev/null
matches "$OUT" '^[0-9]+$' "the fence is printed on stdout"
mkfifo "$WORK/hold.in"
"$PGMUTEX" run --table "$TABLE" --lock hold <"$WORK/hold.in" >"$WORK/hold.out" 2>"$WORK/hold.err" &
holder=$!
background_pids+=("$holder")
exec 7>"$WORK/hold.in"
wait_for_file "$WORK/hold.out"
matches "$WORK/hold.out" '^[0-9]+$' "a holder without a command prints its fence"
expect 75 "the lock is held while stdin stays open" pgm run --lock hold -- true
echo "ignored" >&7
expect 75 "a line on stdin does not let the lock go" pgm run --lock hold -- true
exec 7>&-
wait_exit "$holder" 10; equal "$EXIT" "0" "stdin closed: the holder exits 0"
expect 0 "and the lock is free again" pgm run --lock hold -- true

mkfifo "$WORK/hold2.in"
"$PGMUTEX" run --table "$TABLE" --lock hold <"$WORK/hold2.in" >"$WORK/hold2.out" 2>"$WORK/hold2.err" &
holder=$!
background_pids+=("$holder")
exec 8>"$WORK/hold2.in"
wait_for_file "$WORK/hold2.out"
expect 75 "held without a command until a signal" pgm run --lock hold -- true
kill -TERM "$holder"
wait_exit "$holder" 10; equal "$EXIT" "0" "SIGTERM: the holder releases and exits 0"
expect 0 "the lock is free after SIGTERM" pgm run --lock hold -- true
exec 8>&-

finish
