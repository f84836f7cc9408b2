#!/usr/bin/env bash
# pgmutex run: the lock never outlives the command's process group, and the
# group never outlives the lock: after a lost lease, after a normal exit that
# leaves background processes behind, and when pgmutex itself is SIGKILLed.
source "$(dirname "$0")/lib.sh" "$@"

expect 0 "schema" pgm schema
short=(--heartbeat-interval 0.2 --alert-threshold 1 --stale-threshold 3)

# Running, and not a zombie awaiting its reaper (that one is dead).
running() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null)
  [[ -n "$state" && "$state" != Z* ]]
}
# wait_dead PID SECONDS: true once PID no longer runs, false after SECONDS.
wait_dead() {
  local pid=$1 limit=$2 waited=0
  while running "$pid"; do
    sleep 0.05
    waited=$((waited + 1))
    ((waited > limit * 20)) && return 1
  done
  return 0
}

# A process that ignores SIGTERM (so does every process it execs: sleep) and
# writes its pid to $1 once it does. It ignores SIGHUP too: a terminal that
# closes must not be what kills it in the terminal check.
cat >"$WORK/stubborn" <<'EOF'
#!/bin/sh
trap '' TERM HUP
echo $$ >"$1.tmp" && mv "$1.tmp" "$1"
while :; do sleep 0.1; done
EOF
chmod +x "$WORK/stubborn"

# --- lost lease: a grandchild that ignores SIGTERM is dead when pgmutex exits --
# The direct child (a shell) dies of SIGTERM at once; only SIGKILL to the whole
# group after --grace stops its stubborn child.
"$PGMUTEX" run --table "$TABLE" --lock lost-group "${short[@]}" --grace 1 -- \
  sh -c '"$0" "$1" & wait' "$WORK/stubborn" "$WORK/lost-gc" >"$WORK/lost.out" 2>"$WORK/lost.err" &
holder=$!
background_pids+=("$holder")
wait_for_file "$WORK/lost-gc"
grandchild=$(cat "$WORK/lost-gc")
expect 0 "release --force takes the lock away" pgm release --force lost-group
wait_exit "$holder" 15
equal "$EXIT" "70" "lease lost: exit 70"
if running "$grandchild"; then
  fail "the grandchild that ignores SIGTERM still runs after pgmutex exited"
  kill -KILL "$grandchild" 2>/dev/null
else
  pass "the grandchild that ignores SIGTERM is dead when pgmutex exits"
fi
contains "$WORK/lost.err" "killed with SIGKILL" "pgmutex says it used SIGKILL"

# --- normal exit: a background leftover dies before the lock is released -----
# The command exits 0 at once, leaving a stubborn child behind. A rival that
# waits for the lock checks, as its own command, whether the leftover still runs.
"$PGMUTEX" run --table "$TABLE" --lock leftover --grace 1 -- \
  sh -c '"$0" "$1" & while [ ! -s "$1" ]; do sleep 0.05; done; exit 0' "$WORK/stubborn" "$WORK/left" \
  >"$WORK/left.out" 2>"$WORK/left.err" &
holder=$!
background_pids+=("$holder")
wait_for_file "$WORK/left"
leftover=$(cat "$WORK/left")
expect 0 "a rival waits for the lock" pgm run --lock leftover --wait --timeout 20 -- \
  sh -c 'state=$(ps -o stat= -p "$0"); case "$state" in "" | Z*) echo leftover-dead ;; *) echo leftover-alive ;; esac' "$leftover"
contains "$OUT" "leftover-dead" "the rival got the lock only once the leftover was dead"
wait_exit "$holder" 10
equal "$EXIT" "0" "the holder exits with the command's code"
if running "$leftover"; then fail "the leftover still runs"; kill -KILL "$leftover" 2>/dev/null; else pass "the leftover is gone"; fi
contains "$WORK/left.err" "$leftover" "the line on stderr names the leftover's pid"
contains "$WORK/left.err" "killed the command's leftover processes with SIGKILL" "and says SIGKILL was needed"

# A leftover that obeys SIGTERM needs no SIGKILL, and a command that leaves
# nothing behind gets no such line.
expect 0 "a leftover that obeys SIGTERM" pgm run --lock leftover --grace 30 -- sh -c 'sleep 60 & exit 0'
contains "$ERR" "the command exited but left 1 process behind (pid " "one line names the leftover"
lacks "$ERR" "killed the command's leftover processes" "no SIGKILL for a leftover that obeyed SIGTERM"
expect 0 "a command with no leftovers" pgm run --lock leftover -- sh -c 'sleep 0.1 & wait'
lacks "$ERR" "left" "no leftover line when nothing is left"

# --- from a terminal: the command shares pgmutex's group, leftovers die too ---
# script(1) gives pgmutex a terminal whose foreground group is pgmutex's: the
# command stays in it, and what it orphans is found as pgmutex's children.
command -v script >/dev/null || fail "script (util-linux) is needed for the terminal check"
cat >"$WORK/tty-run" <<EOF
#!/bin/sh
exec "$PGMUTEX" run --table "$TABLE" --lock tty --grace 1 -- sh -c '"\$0" "\$1" & while [ ! -s "\$1" ]; do sleep 0.05; done; echo "pgids \$(ps -o pgid= -p \$\$) \$(ps -o pgid= -p \$PPID)"' "$WORK/stubborn" "$WORK/tty-left"
EOF
chmod +x "$WORK/tty-run"
expect 0 "a run from a terminal" script -qec "$WORK/tty-run" /dev/null
read -r _ command_pgid pgmutex_pgid < <(grep pgids "$OUT" | tr -d '\r')
equal "${command_pgid:-none}" "${pgmutex_pgid:-}" "from a terminal the command stays in pgmutex's process group"
tty_left=$(cat "$WORK/tty-left")
if running "$tty_left"; then fail "the terminal run's leftover outlived pgmutex"; kill -KILL "$tty_left"; else
  pass "the terminal run's leftover is dead when pgmutex exits"; fi
contains "$OUT" "killed the command's leftover processes with SIGKILL" "the terminal run says so"

# From a terminal the gated child shares pgmutex's group while pgmutex waits
# (and drops what reached it there: pgmutex acted on it). The command starts
# once the lock comes, in that group; a resized terminal meanwhile changes nothing.
"$PGMUTEX" run --table "$TABLE" --lock tty-wait -- sh -c 'echo held >"$0"; while [ ! -e "$0.go" ]; do sleep 0.05; done' \
  "$WORK/tty-wait-held" >/dev/null 2>&1 &
tty_holder=$!
background_pids+=("$tty_holder")
wait_for_file "$WORK/tty-wait-held"
printf '#!/bin/sh\nexec "%s" run --table "%s" --lock tty-wait --wait -- sh -c '"'"'echo "the command ran"'"'"'\n' \
  "$PGMUTEX" "$TABLE" >"$WORK/tty-wait"
chmod +x "$WORK/tty-wait"
script -qec "$WORK/tty-wait" /dev/null >"$WORK/tty-wait.out" 2>&1 &
tty_script=$!
background_pids+=("$tty_script")
tty_waiter=""
for _ in $(seq 200); do
  tty_waiter=$(pgrep -f -- "--lock tty-wait --wait" | head -1)
  [[ -n "$tty_waiter" && -n "$(ps -o pid= --ppid "$tty_waiter")" ]] && break
  sleep 0.05
done
if [[ -z "$tty_waiter" ]]; then
  fail "the terminal's waiter did not start"
else
  sleep 0.3
  kill -WINCH -- "-$(ps -o pgid= -p "$tty_waiter" | tr -d ' ')"
  sleep 0.3
  touch "$WORK/tty-wait-held.go"
  wait_exit "$tty_script" 15
  contains "$WORK/tty-wait.out" "the command ran" "a terminal's waiter runs its command once granted"
fi
wait_exit "$tty_holder" 10

# --- pgmutex SIGKILLed: the command dies even after changing its user --------
# PR_SET_PDEATHSIG does not survive a change of user; the guard process does.
if [[ $(id -u) != 0 ]]; then
  fail "this check needs root (setpriv --reuid=nobody): run the tests as root"
else
  "$PGMUTEX" run --table "$TABLE" --lock setpriv -- \
    setpriv --reuid=nobody --regid=nogroup --clear-groups sh -c 'sleep 77 & wait' >/dev/null 2>"$WORK/setpriv.err" &
  holder=$!
  background_pids+=("$holder")
  # The command's shell, once it runs as nobody, and its child.
  waited=0
  while [[ -z "$(pgrep -u nobody -P "$holder")" ]] && ((waited < 200)); do sleep 0.05; waited=$((waited + 1)); done
  command_pid=$(pgrep -u nobody -P "$holder")
  waited=0
  while [[ -z "$(pgrep -P "$command_pid" 2>/dev/null)" ]] && ((waited < 200)); do sleep 0.05; waited=$((waited + 1)); done
  sleeper=$(pgrep -P "$command_pid")
  helpers=$(pgrep -u 0 -P "$holder" | tr '\n' ' ')
  if [[ -z "$command_pid" || -z "$sleeper" ]]; then
    fail "the command did not start as nobody: $(cat "$WORK/setpriv.err")"
  else
    pass "the command runs as nobody (pid $command_pid, its child $sleeper)"
    kill -KILL "$holder"
    wait "$holder" 2>/dev/null
    for pid in $command_pid $sleeper; do
      if wait_dead "$pid" 5; then pass "pid $pid died with the SIGKILLed pgmutex"; else
        fail "pid $pid ($(ps -o user=,args= -p "$pid")) outlived the SIGKILLed pgmutex"
        kill -KILL "$pid" 2>/dev/null
      fi
    done
    # pgmutex's own helper (not the command) does not outlive it either.
    for pid in $helpers; do
      if wait_dead "$pid" 5; then pass "pgmutex's helper $pid is gone too"; else
        fail "pgmutex's helper $pid ($(ps -o args= -p "$pid")) outlived pgmutex"
        kill -KILL "$pid" 2>/dev/null
      fi
    done
  fi
fi

# --- a waiter's child and guard: forked before the wait, let go at the grant -
# guard_of PID: the pgmutex-guard child of pgmutex PID, if any.
guard_of() { ps -o pid=,comm= --ppid "$1" | awk '$2 == "pgmutex-guard" { print $1 }'; }
# wait_guard PID [NOT]: prints the guard of PID once it has one (other than NOT).
wait_guard() {
  local waited=0 guard
  while ((waited < 200)); do
    guard=$(guard_of "$1")
    [[ -n "$guard" && "$guard" != "${2:-}" ]] && { echo "$guard"; return 0; }
    sleep 0.05
    waited=$((waited + 1))
  done
  return 1
}
"$PGMUTEX" run --table "$TABLE" --lock ahead -- sh -c 'echo held >"$1"; while [ ! -e "$0" ]; do sleep 0.05; done' \
  "$WORK/ahead-go" "$WORK/ahead-held" >/dev/null 2>"$WORK/ahead-holder.err" &
ahead_holder=$!
background_pids+=("$ahead_holder")
wait_for_file "$WORK/ahead-held"
# Its environment is filled at the grant (the fence, the instance): a stale
# PGMUTEX_FENCE of its own (a nested run) must not get through.
PGMUTEX_FENCE=stale "$PGMUTEX" run --table "$TABLE" --lock ahead --wait --instance-id waiter-ahead -- \
  sh -c 'echo "$PGMUTEX_FENCE $PGMUTEX_INSTANCE $PGMUTEX_LOCK" >"$0.env"; echo $$ >"$0.tmp" && mv "$0.tmp" "$0"; sleep 77 & wait' \
  "$WORK/ahead-cmd" >/dev/null 2>"$WORK/ahead-waiter.err" &
ahead_waiter=$!
background_pids+=("$ahead_waiter")
if early_guard=$(wait_guard "$ahead_waiter"); then
  pass "a waiting run has its guard process before the grant (pid $early_guard)"
else
  fail "no pgmutex-guard child of the waiting pgmutex $ahead_waiter"
fi
# Killed while it waits, unarmed, and so is the gated child: the grant forks
# each again, and the command runs all the same.
early_child=$(ps -o pid=,comm= --ppid "$ahead_waiter" | awk '$2 != "pgmutex-guard" { print $1 }')
[[ -z "$early_guard" ]] || kill -KILL "$early_guard"
[[ -z "$early_child" ]] || kill -KILL "$early_child"
touch "$WORK/ahead-go"
wait_for_file "$WORK/ahead-cmd" && pass "the command runs though its gated child was killed during the wait"
if late_guard=$(wait_guard "$ahead_waiter" "$early_guard"); then
  pass "the guard killed during the wait was replaced at the grant (pid $late_guard)"
else
  fail "the command runs without a guard after its first one was killed during the wait"
fi
lacks "$WORK/ahead-waiter.err" "guard process" "no warning about the replaced guard"
read -r ahead_fence ahead_instance ahead_lock <"$WORK/ahead-cmd.env"
[[ "$ahead_fence" =~ ^[0-9]+$ ]] && pass "the waiter's command got its fence at the grant ($ahead_fence)" ||
  fail "the waiter's command got PGMUTEX_FENCE '$ahead_fence'"
equal "$ahead_instance $ahead_lock" "waiter-ahead ahead" "and its PGMUTEX_INSTANCE and PGMUTEX_LOCK"
expect 0 "status of the lock held by the waiter" pgm status ahead --json
contains "$OUT" "\"fence\": $ahead_fence" "the fence the command got is the lock's"
ahead_cmd=$(cat "$WORK/ahead-cmd")
ahead_sleeper=$(pgrep -P "$ahead_cmd")
kill -KILL "$ahead_waiter"
wait "$ahead_waiter" 2>/dev/null
for pid in $ahead_cmd $ahead_sleeper; do
  if wait_dead "$pid" 5; then pass "pid $pid died with the SIGKILLed pgmutex (the replacement guard)"; else
    fail "pid $pid outlived the SIGKILLed pgmutex: the replacement guard did not kill it"
    kill -KILL "$pid" 2>/dev/null
  fi
done
wait_exit "$ahead_holder" 10

# A waiter that never gets the lock: its guard ends with it, killed or timed out.
"$PGMUTEX" run --table "$TABLE" --lock ahead-2 -- sh -c 'echo held >"$0"; sleep 30' "$WORK/ahead-2-held" >/dev/null 2>&1 &
ahead_holder=$!
background_pids+=("$ahead_holder")
wait_for_file "$WORK/ahead-2-held"
for how in SIGKILL timeout; do
  "$PGMUTEX" run --table "$TABLE" --lock ahead-2 -w 1.5 -- touch "$WORK/ahead-2-ran" >/dev/null 2>&1 &
  ahead_waiter=$!
  background_pids+=("$ahead_waiter")
  waiting_guard=$(wait_guard "$ahead_waiter")
  # Its gated command child, forked with the guard before the wait.
  waiting_child=$(ps -o pid=,comm= --ppid "$ahead_waiter" | awk '$2 != "pgmutex-guard" { print $1 }')
  [[ -n "$waiting_child" ]] && pass "the waiter ($how) forked its command's child before the grant" ||
    fail "the waiter ($how) has no child but its guard before the grant"
  if [[ $how == SIGKILL ]]; then
    kill -KILL "$ahead_waiter"
    wait "$ahead_waiter" 2>/dev/null
  else
    wait_exit "$ahead_waiter" 10
    equal "$EXIT" "75" "the timed-out waiter exits 75"
  fi
  if [[ -n "$waiting_guard" ]] && wait_dead "$waiting_guard" 5; then
    pass "the guard of a waiter that ends by $how, never granted, ends with it"
  else
    fail "the guard ($waiting_guard) of a waiter that ended by $how outlived it"
  fi
  if [[ -n "$waiting_child" ]] && wait_dead "$waiting_child" 5; then
    pass "its command's child, never let through its gate, ends with it"
  else
    fail "the gated child ($waiting_child) of a waiter that ended by $how outlived it"
  fi
done
[[ ! -e "$WORK/ahead-2-ran" ]] && pass "neither waiter ran its command" || fail "a waiter that was never granted ran its command"
kill -TERM "$ahead_holder"
wait_exit "$ahead_holder" 10

# --- the connection goes to the guard as pgmutex exits ----------------------
# After the release, pgmutex hands its connection's socket to the guard, which
# closes it 50 ms later without libpq's Terminate message: the server process's
# end is then not on the next holder's path. The server notes a connection
# closed that way at DEBUG1 only ("unexpected EOF on client connection"):
# asked of that session alone (PGOPTIONS), the line shows the hand-over.
server_log="$PGMUTEX_TEST_PGDATA/../server.log"
eof_lines() { grep -c "unexpected EOF on client connection" "$server_log"; }
wait_eof_lines() {  # wait_eof_lines N: until the log has more than N such lines (5 s at most)
  local waited=0
  while (($(eof_lines) <= $1 && waited < 100)); do sleep 0.05; waited=$((waited + 1)); done
  (($(eof_lines) > $1))
}
log_mark=$(wc -l <"$server_log")
before=$(eof_lines)
PGOPTIONS="-c log_min_messages=debug1" pgm status >/dev/null
sleep 0.3
equal "$(eof_lines)" "$before" "a command without a guard (status) ends its session with Terminate"
for how in --wait --no-wait; do
  before=$(eof_lines)
  captured=$(PGOPTIONS="-c log_min_messages=debug1" "$PGMUTEX" run --table "$TABLE" --lock handed "$how" -- echo out)
  equal "$captured" "out" "run $how: its output, captured, ends with it (the guard keeps none of pgmutex's streams)"
  if wait_eof_lines "$before"; then pass "run $how: its connection went to the guard, closed without Terminate"; else
    fail "run $how: no 'unexpected EOF on client connection' in the server log: the connection was not handed over"
  fi
done
before=$(eof_lines)
PGOPTIONS="-c log_min_messages=debug1" "$PGMUTEX" run --table "$TABLE" --lock handed --wait -- sh -c 'exit 3'
equal "$?" "3" "run: the command's exit code, with the connection handed over"
wait_eof_lines "$before" && pass "a failing command's run hands its connection over too" ||
  fail "a failing command's run did not hand its connection over"
# Two short commands queued one behind the other: the second's release comes
# while the first's connection lingers, and its NOTIFY reaches that
# connection (it LISTENed while it waited), unread by anyone.
"$PGMUTEX" run --table "$TABLE" --lock handed-queue -- sh -c 'echo held >"$1"; while [ ! -e "$0" ]; do sleep 0.02; done' \
  "$WORK/handed-go" "$WORK/handed-held" >/dev/null 2>&1 &
handed_holder=$!
background_pids+=("$handed_holder")
wait_for_file "$WORK/handed-held"
queued=()
for i in 1 2 3; do
  PGOPTIONS="-c log_min_messages=debug1" "$PGMUTEX" run --table "$TABLE" --lock handed-queue --wait -- true &
  queued+=($!)
  sleep 0.2
done
touch "$WORK/handed-go"
wait_exit "$handed_holder" 10
for pid in "${queued[@]}"; do wait "$pid"; done
sleep 1.2  # each guard's linger, and its read to the end (1 s at most)
# Closed with bytes unread (a NOTIFY that reached the lingering connection),
# a socket resets the connection, which the server logs: the guard reads to
# the end first. Only our sessions' server processes are looked at (other
# tests share the server, and kill clients).
cut_short=""
for pid in $(tail -n +"$((log_mark + 1))" "$server_log" | sed -n 's/.*\[\([0-9]*\)\] DEBUG:  unexpected EOF on client connection.*/\1/p'); do
  cut_short+=$(grep "\[$pid\] LOG:  could not receive data from client" "$server_log")
done
[[ -z "$cut_short" ]] && pass "the server logged none of the handed-over connections as cut short" ||
  fail "the server logged a handed-over connection cut short: $cut_short"

finish
