#!/usr/bin/env bash
# pgmutex run forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to
# the command and exits with its code (128+N when the signal killed it),
# releasing the lock.
set -m  # job control: background jobs keep SIGINT (bash ignores it for them otherwise)
source "$(dirname "$0")/lib.sh" "$@"

expect 0 "schema" pgm schema

# start_holder LOCK SCRIPT: runs SCRIPT under the lock in the background; the
# script writes $ready once its traps are set.
start_holder() {
  rm -f "$WORK/ready"
  "$PGMUTEX" run --table "$TABLE" --lock "$1" -- sh -c "$2" "$WORK/ready" >"$WORK/holder.out" 2>"$WORK/holder.err" &
  holder=$!
  background_pids+=("$holder")
  wait_for_file "$WORK/ready"
}

for sig in INT TERM HUP QUIT USR1 USR2; do
  num=$(kill -l "$sig")
  # The command traps the signal and exits with its own code: proof that it
  # was forwarded and that pgmutex waited for the command.
  start_holder "sig-$sig" "trap 'echo got-$sig; exit 42' $sig; echo ready >\"\$0\"; while :; do sleep 0.1; done"
  kill -"$sig" "$holder"
  wait_exit "$holder" 10; equal "$EXIT" "42" "SIG$sig forwarded; pgmutex exits with the command's code"
  contains "$WORK/holder.out" "got-$sig" "the command received SIG$sig"
  expect 0 "status after SIG$sig" pgm status "sig-$sig" --json
  equal "$(jq -c '.locks' "$OUT")" "[]" "lock released after SIG$sig"

  # The command does not trap it: it dies of the signal, pgmutex exits 128+N.
  start_holder "sig-$sig" "echo ready >\"\$0\"; exec sleep 30"
  kill -"$sig" "$holder"
  wait_exit "$holder" 10; equal "$EXIT" "$((128 + num))" "killed by SIG$sig: exit 128+$num"
  expect 0 "status after death by SIG$sig" pgm status "sig-$sig"
  contains "$OUT" "is not held" "lock released after death by SIG$sig"
done

# The whole process group of the command gets the signal: a shell's children too.
start_holder "sig-group" "sleep 30 & echo \$! >\"\$0.child\"; echo ready >\"\$0\"; wait"
grandchild=$(cat "$WORK/ready.child")
kill -TERM "$holder"
wait_exit "$holder" 10; equal "$EXIT" "143" "shell killed by SIGTERM: 143"
# pgmutex exits only once its group is empty: no waiting here. (A zombie that
# its new parent has not reaped yet is gone too.)
[[ $(ps -o stat= -p "$grandchild") == Z* || -z $(ps -o stat= -p "$grandchild") ]] &&
  pass "the command's child got SIGTERM too" || fail "the command's own child survived SIGTERM"

# An interrupt while waiting for the lock cancels the wait: nothing runs.
start_holder "sig-wait" "echo ready >\"\$0\"; sleep 30"
"$PGMUTEX" run --table "$TABLE" --lock sig-wait --wait -- touch "$WORK/waiter-ran" >/dev/null 2>"$WORK/waiter.err" &
waiter=$!
background_pids+=("$waiter")
sleep 0.5
kill -INT "$waiter"
wait_exit "$waiter" 5; equal "$EXIT" "130" "SIGINT while waiting: exit 130"
contains "$WORK/waiter.err" "interrupted by SIGINT while waiting for lock 'sig-wait'" "the waiter says why"
[[ ! -e "$WORK/waiter-ran" ]] && pass "the waiter's command never ran" || fail "the waiter's command ran"
kill -TERM "$holder"
wait_exit "$holder" 10

# Held without a command (as etcdctl lock NAME): SIGINT lets it go, exit 0.
mkfifo "$WORK/hold.in"
"$PGMUTEX" run --table "$TABLE" --lock sig-hold <"$WORK/hold.in" >"$WORK/hold.out" 2>"$WORK/hold.err" &
hold=$!
background_pids+=("$hold")
exec 7>"$WORK/hold.in"
wait_for_file "$WORK/hold.out"
expect 75 "held without a command until SIGINT" pgm run --lock sig-hold -- true
kill -INT "$hold"
wait_exit "$hold" 10; equal "$EXIT" "0" "SIGINT: the lock held without a command is released, exit 0"
expect 0 "the lock is free after SIGINT" pgm run --lock sig-hold -- true
exec 7>&-

finish
