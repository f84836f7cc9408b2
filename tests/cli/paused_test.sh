#!/usr/bin/env bash
# pgmutex itself stopped, its command not: the guard process enforces the lease.
#
# The holder's pgmutex leads a process group of its own (setsid) and that
# whole group gets SIGSTOP after the lock was taken; the command, in its own
# group, runs on and appends a timestamp every 50 ms. pgmutex sends no
# heartbeats any more, so once the row is stale a rival (--wait) takes the
# lock and records when its command ran. The guard, in a group of its own,
# must have stopped the holder's command before its lease ran out: no write of
# the holder's falls inside the rival's run. After SIGCONT pgmutex exits 70
# and says the lock was lost.
#
# PGMUTEX_PAUSED_VERB=elect runs the same with a leader (pgmutex elect) and a
# rival candidate: a stopped leader acts as leader no longer than its lease,
# and the successor leads with a higher term.
source "$(dirname "$0")/lib.sh" "$@"
verb=${PGMUTEX_PAUSED_VERB:-run}
if [[ "$verb" == elect ]]; then
  holder_args=(elect --value holder)
  rival_args=(elect --value rival -w 20)
else
  holder_args=(run)
  rival_args=(run --wait --timeout 20)
  lost_text="lock 'paused' was lost"
fi

expect 0 "schema" pgm schema
# A 2.3 s lease (4 s - a 1.7 s margin: the 0.5 s grace, a 1 s attempt, the
# 0.2 s interval); the guard sends SIGTERM 0.5 s before it runs out.
short=(--heartbeat-interval 0.2 --alert-threshold 1 --stale-threshold 4 --grace 0.5)

# Timestamps in microseconds, from bash's own clock (no process per write).
setsid "$PGMUTEX" "${holder_args[0]}" --table "$TABLE" "${holder_args[@]:1}" --lock paused "${short[@]}" -- bash -c \
  'echo $$ >"$0"; echo "${PGMUTEX_FENCE:-0}" >"$0.fence"; while :; do echo "${EPOCHREALTIME/./}" >>"$1"; sleep 0.05; done' \
  "$WORK/pid" "$WORK/holder.log" \
  >"$WORK/holder.out" 2>"$WORK/holder.err" &
holder=$!  # setsid execs pgmutex: this is pgmutex, and it leads its process group
background_pids+=("$holder")
if ! wait_for_file "$WORK/pid" || ! wait_for_file "$WORK/holder.log"; then
  fail "the holder did not start its command: $(cat "$WORK/holder.err")"
  finish
fi
command_pid=$(cat "$WORK/pid")
background_pids+=("$command_pid")

pgmutex_pgid=$(ps -o pgid= -p "$holder" | tr -d ' ')
equal "$pgmutex_pgid" "$holder" "pgmutex leads its own process group (setsid)"
guard_pid=$(ps -o pid=,comm= --ppid "$holder" | awk '$2 == "pgmutex-guard" { print $1 }')
[[ -n "$guard_pid" ]] && pass "the guard process runs (pid $guard_pid)" || fail "no pgmutex-guard child of pgmutex $holder"
guard_pgid=$(ps -o pgid= -p "${guard_pid:-0}" | tr -d ' ')
[[ -n "$guard_pgid" && "$guard_pgid" != "$pgmutex_pgid" ]] && pass "the guard is not in pgmutex's process group" ||
  fail "the guard's process group is '$guard_pgid', pgmutex's is $pgmutex_pgid: stopping pgmutex's group stops the guard"
command_pgid=$(ps -o pgid= -p "$command_pid" | tr -d ' ')
[[ "$command_pgid" != "$pgmutex_pgid" ]] && pass "the command has its own process group" ||
  fail "the command is in pgmutex's process group: SIGSTOP to the group would stop it too"

# Stop pgmutex's whole process group: pgmutex, and nothing else of ours.
kill -STOP -- "-$pgmutex_pgid"
stopped_at=$(now_ms)
sleep 0.3
[[ $(ps -o stat= -p "$holder") == T* ]] && pass "pgmutex is stopped" || fail "pgmutex is not stopped: $(ps -o stat= -p "$holder")"
[[ $(ps -o stat= -p "$command_pid") != T* ]] && pass "its command is not stopped" || fail "the command was stopped too"

# The rival waits for the row to go stale (4 s after the last heartbeat).
expect 0 "a rival takes the lock once the stopped holder's row is stale" \
  pgm "${rival_args[@]}" --lock paused "${short[@]}" -- bash -c \
  'echo "${EPOCHREALTIME/./}" >"$0"; echo "$PGMUTEX_FENCE" >"$0.fence"; sleep 1.5; echo "${EPOCHREALTIME/./}" >"$1"' \
  "$WORK/rival.start" "$WORK/rival.end"
rival_start=$(cat "$WORK/rival.start" 2>/dev/null || echo 0)
rival_end=$(cat "$WORK/rival.end" 2>/dev/null || echo 0)
((rival_start > 0 && rival_end > rival_start)) && pass "the rival's command ran $(((rival_end - rival_start) / 1000)) ms" ||
  fail "the rival's command did not run (start '$rival_start', end '$rival_end')"
echo "the rival got the lock $((rival_start / 1000 - stopped_at)) ms after pgmutex was stopped"

overlapping=$(awk -v from="$rival_start" -v to="$rival_end" '$1 >= from && $1 <= to' "$WORK/holder.log" | wc -l)
after=$(awk -v from="$rival_start" '$1 >= from' "$WORK/holder.log" | wc -l)
last_write=$(tail -n 1 "$WORK/holder.log")
echo "holder's command: $(line_count "$WORK/holder.log") writes, $overlapping during the rival's run, $after after its start; last write $(((rival_start - last_write) / 1000)) ms before the rival's start"
equal "$overlapping" "0" "the stopped holder's command never wrote while the rival held the lock"
equal "$after" "0" "nor after the rival got the lock"
stat=$(ps -o stat= -p "$command_pid")
[[ -z "$stat" || $stat == Z* ]] && pass "the holder's command is gone while pgmutex is still stopped" ||
  fail "the holder's command still runs ($stat)"
contains "$WORK/holder.err" "pgmutex-guard: no lease renewal from pgmutex for lock 'paused'" "the guard says why it stopped the command"

kill -CONT -- "-$pgmutex_pgid"
wait_exit "$holder" 30
equal "$EXIT" "70" "after SIGCONT, pgmutex exits 70 (lost)"
holder_term=$(cat "$WORK/pid.fence")
[[ "$verb" == elect ]] && lost_text="the leadership of lock 'paused' (term $holder_term) was lost"
contains "$WORK/holder.err" "$lost_text" "and says the lock was lost"
if [[ "$verb" == elect ]]; then
  rival_term=$(cat "$WORK/rival.start.fence" 2>/dev/null || echo 0)
  ((rival_term > holder_term)) && pass "the successor leads with a higher term ($rival_term > $holder_term)" ||
    fail "terms: the stopped leader's $holder_term, the successor's $rival_term"
fi
[[ -z $(ps -o pid= -p "${guard_pid:-0}") ]] && pass "the guard is gone" || fail "the guard outlived pgmutex"
finish
