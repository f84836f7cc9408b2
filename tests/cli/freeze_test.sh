#!/usr/bin/env bash
# A holder paused with SIGSTOP keeps its lock from a rival with a shorter
# --stale-threshold: the holder's threshold is stored with its grant.
#
# A frozen peer during a hold: tests/tools/fault_proxy.py sits between pgmutex
# and the server and stops answering (the connection stays open, the kernel
# still ACKs). The lease deadline still fires, the command's group is dead
# before a rival connected directly gets the lock, and pgmutex exits 70.
source "$(dirname "$0")/lib.sh" "$@"

expect 0 "schema" pgm schema
start_fault_proxy

short=(--heartbeat-interval 0.2 --alert-threshold 1 --stale-threshold 4 --grace 0.5)
# The command ignores SIGTERM, so only the SIGKILL after --grace ends it.
"$PGMUTEX" run --table "$TABLE" --dsn "host=127.0.0.1 port=$proxy_port" --lock frozen "${short[@]}" \
  -- sh -c 'trap "" TERM; echo $$ >"$0"; while :; do sleep 0.1; done' "$WORK/pid" \
  >"$WORK/holder.out" 2>"$WORK/holder.err" &
holder=$!
background_pids+=("$holder")
wait_for_file "$WORK/pid"
command_pid=$(cat "$WORK/pid")

proxy_mode freeze
# The rival, connected directly, tries until it gets the lock; its command
# then looks at the holder's command.
rival_rc=75
for _ in $(seq 1 300); do
  pgm run --lock frozen "${short[@]}" -- sh -c \
    "stat=\$(ps -o stat= -p $command_pid); case \"\$stat\" in ''|Z*) echo dead ;; *) echo alive ;; esac" \
    >"$WORK/rival.out" 2>"$WORK/rival.err"
  rival_rc=$?
  [[ $rival_rc -ne 75 ]] && break
  sleep 0.05
done
equal "$rival_rc" "0" "the rival got the lock and ran its command"
contains "$WORK/rival.out" "dead" "the frozen holder's command was dead before the rival got the lock"
wait_exit "$holder" 30
equal "$EXIT" "70" "the frozen holder exits 70"
contains "$WORK/holder.err" "lock 'frozen' was lost" "and says the lock was lost"
proxy_mode pass

# --- a paused holder with a long threshold, a rival with a short one ---------
"$PGMUTEX" run --table "$TABLE" --lock patient --stale-threshold 600 -- sh -c 'echo $$ >"$0"; sleep 60' "$WORK/patient" \
  >/dev/null 2>&1 &
patient=$!
background_pids+=("$patient")
wait_for_file "$WORK/patient"
kill -STOP "$patient"
sleep 3  # past the rival's 2 s: only the holder's 600 s keeps the row
expect 75 "a rival with --stale-threshold 2 cannot take a paused holder's lock kept with 600 s" \
  pgm run --lock patient --heartbeat-interval 0.5 --alert-threshold 1 --stale-threshold 2 -- true
kill -CONT "$patient"
kill -TERM "$patient"
wait_exit "$patient" 30
finish
