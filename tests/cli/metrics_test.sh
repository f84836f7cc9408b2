#!/usr/bin/env bash
# Metrics where operators look: status --format prometheus and
# run --metrics-file, checked by promtool and read back through a real
# node_exporter's textfile collector.
source "$(dirname "$0")/lib.sh" "$@"
for tool in promtool prometheus-node-exporter curl python3; do
  command -v "$tool" >/dev/null || { fail "$tool is needed (scripts/install-deps)"; finish; }
done

# valid FILE WHAT: promtool accepts FILE, with no lint complaint either.
valid() {
  if promtool check metrics <"$1" >"$WORK/promtool" 2>&1 && [[ ! -s "$WORK/promtool" ]]; then
    pass "$2: promtool check metrics is silent"
  else
    fail "$2: promtool check metrics: $(cat "$WORK/promtool"); the file: $(cat "$1")"
  fi
}
# value FILE NAME LABEL...: the value of the one sample of NAME with all these labels (k="v").
value() {
  local file=$1 name=$2
  shift 2
  grep -E "^$name\{" "$file" | while read -r line; do
    local all=1
    for label in "$@"; do [[ $line == *"$label"* ]] || all=0; done
    ((all)) && echo "${line##* }"
  done
}

expect 0 "schema" pgm schema
short=(--heartbeat-interval 0.2 --alert-threshold 1 --stale-threshold 60)

# --- status --format prometheus ----------------------------------------------
"$PGMUTEX" run --table "$TABLE" --lock held-job "${short[@]}" -- \
  sh -c 'echo "$PGMUTEX_INSTANCE $PGMUTEX_FENCE" >"$0.tmp" && mv "$0.tmp" "$0"; sleep 30' "$WORK/held" >/dev/null 2>&1 &
holder=$!
background_pids+=("$holder")
wait_for_file "$WORK/held"
read -r held_instance held_fence <"$WORK/held"

expect 0 "status --format prometheus" pgm status --format prometheus
cp "$OUT" "$WORK/status.prom"
valid "$WORK/status.prom" "status exposition"
for family in pgmutex_lock_held pgmutex_lock_heartbeat_age_seconds pgmutex_lock_fence pgmutex_lock_state; do
  contains "$WORK/status.prom" "# HELP $family " "HELP line of $family"
  contains "$WORK/status.prom" "# TYPE $family gauge" "TYPE line of $family"
done
labels="lock=\"held-job\",instance=\"$held_instance\""
equal "$(value "$WORK/status.prom" pgmutex_lock_held "$labels")" "1" "held 1, labelled lock and instance"
equal "$(value "$WORK/status.prom" pgmutex_lock_fence "$labels")" "$held_fence" "the fence the command got"
age=$(value "$WORK/status.prom" pgmutex_lock_heartbeat_age_seconds "$labels")
[[ $age =~ ^[0-9.e-]+$ ]] && pass "heartbeat age is a number ($age)" || fail "heartbeat age: '$age'"
equal "$(value "$WORK/status.prom" pgmutex_lock_state "$labels" 'state="ok"')" "1" "state ok 1"
equal "$(value "$WORK/status.prom" pgmutex_lock_state "$labels" 'state="alert"')" "0" "state alert 0"
equal "$(value "$WORK/status.prom" pgmutex_lock_state "$labels" 'state="stale"')" "0" "state stale 0"
# The same row as JSON: the two formats agree.
expect 0 "status --json" pgm status held-job --json
equal "$(jq -r '.locks[0].fence' "$OUT")" "$held_fence" "json agrees on the fence"
equal "$(value "$WORK/status.prom" pgmutex_lock_state "$labels" 'state="expired"')" "0" "state expired 0"
# Thresholds below the age, by the same rule as the table: alert, not stale,
# since the holder stored 60 s and a reclaim waits for the larger.
expect 0 "status --format prometheus, past our thresholds" pgm status held-job --format prometheus --alert-threshold 0.000001 --stale-threshold 0.000002
equal "$(value "$OUT" pgmutex_lock_state "$labels" 'state="alert"')" "1" "state alert 1 past the alert threshold"
equal "$(value "$OUT" pgmutex_lock_state "$labels" 'state="stale"')" "0" "state stale 0 before the holder's stale threshold"
expect 0 "status of a free lock" pgm status free-job --format prometheus
cp "$OUT" "$WORK/free.prom"
valid "$WORK/free.prom" "free lock exposition"
equal "$(value "$WORK/free.prom" pgmutex_lock_held 'lock="free-job"')" "0" "a free lock asked by name: held 0"
expect 64 "--format and --json together" pgm status --format json --json
expect 64 "an unknown format" pgm status --format xml

# --- run --metrics-file: the command's exit code, acquired, the fence ---------
mkdir -p "$WORK/textfile"
ok_file="$WORK/textfile/ok.prom"
before=$(date +%s)
expect 3 "a run that exits 3" pgm run --lock ok-job --metrics-file "$ok_file" -- \
  sh -c 'echo "$PGMUTEX_INSTANCE $PGMUTEX_FENCE" >"$0"; exit 3' "$WORK/ok"
after=$(date +%s)
read -r ok_instance ok_fence <"$WORK/ok"
valid "$ok_file" "run metrics file"
ok_labels="lock=\"ok-job\",instance=\"$ok_instance\""
equal "$(value "$ok_file" pgmutex_run_exit_code "$ok_labels")" "3" "exit code 3"
equal "$(value "$ok_file" pgmutex_run_fence "$ok_labels")" "$ok_fence" "the fence the command got"
equal "$(value "$ok_file" pgmutex_run_lock_outcome "$ok_labels" 'outcome="acquired"')" "1" "outcome acquired 1"
equal "$(value "$ok_file" pgmutex_run_lock_outcome "$ok_labels" 'outcome="taken"')" "0" "outcome taken 0"
equal "$(value "$ok_file" pgmutex_run_lock_outcome "$ok_labels" 'outcome="lost"')" "0" "outcome lost 0"
start=$(value "$ok_file" pgmutex_run_start_time_seconds "$ok_labels")
end=$(value "$ok_file" pgmutex_run_end_time_seconds "$ok_labels")
duration=$(value "$ok_file" pgmutex_run_duration_seconds "$ok_labels")
wait_s=$(value "$ok_file" pgmutex_run_lock_wait_seconds "$ok_labels")
python3 -c "import sys; s,e,d,w,b,a=map(float,sys.argv[1:]); sys.exit(0 if b<=s<=e<=a+1 and 0<=w<=d<=e-s+0.01 else 1)" \
  "$start" "$end" "$duration" "$wait_s" "$before" "$after" &&
  pass "start <= end within the run, 0 <= wait <= duration ($start $end $duration $wait_s)" ||
  fail "times: start $start end $end duration $duration wait $wait_s (run between $before and $after)"
leftovers=$(find "$WORK/textfile" -name '*.tmp' | wc -l)
equal "$leftovers" "0" "no temporary file left beside it"

# A file that cannot be written is a warning; the exit code stays the run's.
expect 0 "a metrics file in a missing folder" pgm run --lock ok-job --metrics-file "$WORK/missing/x.prom" -- true
contains "$ERR" "warning: could not write the metrics file $WORK/missing/x.prom: No such file or directory" "says so"

# --- taken: exit 75 -----------------------------------------------------------
taken_file="$WORK/textfile/taken.prom"
expect 75 "a run that finds the lock taken" pgm run --lock held-job --instance-id contender --metrics-file "$taken_file" -- true
valid "$taken_file" "taken metrics file"
equal "$(value "$taken_file" pgmutex_run_exit_code 'lock="held-job"' 'instance="contender"')" "75" "exit code 75"
equal "$(value "$taken_file" pgmutex_run_lock_outcome 'instance="contender"' 'outcome="taken"')" "1" "outcome taken 1"
equal "$(value "$taken_file" pgmutex_run_fence 'instance="contender"')" "0" "no fence"
kill -TERM "$holder"
wait_exit "$holder" 10

# --- lost: exit 70 ------------------------------------------------------------
lost_file="$WORK/textfile/lost.prom"
"$PGMUTEX" run --table "$TABLE" --lock lost-job --heartbeat-interval 0.2 --alert-threshold 1 --stale-threshold 60 \
  --metrics-file "$lost_file" -- sh -c 'echo "$PGMUTEX_FENCE" >"$0"; while :; do sleep 0.1; done' "$WORK/lost" \
  >/dev/null 2>&1 &
lost_pid=$!
background_pids+=("$lost_pid")
wait_for_file "$WORK/lost"
expect 0 "release --force under the holder" pgm release --force lost-job
wait_exit "$lost_pid" 30
equal "$EXIT" "70" "the holder exits 70"
valid "$lost_file" "lost metrics file"
equal "$(value "$lost_file" pgmutex_run_exit_code 'lock="lost-job"')" "70" "exit code 70"
equal "$(value "$lost_file" pgmutex_run_lock_outcome 'lock="lost-job"' 'outcome="lost"')" "1" "outcome lost 1"
equal "$(value "$lost_file" pgmutex_run_fence 'lock="lost-job"')" "$(cat "$WORK/lost")" "the fence it had"

# --- signals: while the command runs, while waiting, while connecting --------
term_file="$WORK/textfile/term.prom"
"$PGMUTEX" run --table "$TABLE" --lock term-job --metrics-file "$term_file" -- \
  sh -c 'echo ready >"$0"; sleep 30' "$WORK/term" >/dev/null 2>&1 &
term_pid=$!
background_pids+=("$term_pid")
wait_for_file "$WORK/term"
kill -TERM "$term_pid"
wait_exit "$term_pid" 30
equal "$EXIT" "143" "SIGTERM while the command runs: 128+15"
equal "$(value "$term_file" pgmutex_run_exit_code 'lock="term-job"')" "143" "file says 143"
equal "$(value "$term_file" pgmutex_run_lock_outcome 'lock="term-job"' 'outcome="acquired"')" "1" "it had acquired"

"$PGMUTEX" run --table "$TABLE" --lock wait-job -- sh -c 'echo ready >"$0"; sleep 30' "$WORK/blocker" >/dev/null 2>&1 &
blocker=$!
background_pids+=("$blocker")
wait_for_file "$WORK/blocker"
wait_file="$WORK/textfile/wait.prom"
"$PGMUTEX" run --table "$TABLE" --lock wait-job --wait --metrics-file "$wait_file" -- true >/dev/null 2>"$WORK/waiter.err" &
waiter=$!
background_pids+=("$waiter")
# Interrupt it once it waits: a waiter takes its place in the lock's queue before it blocks.
# (SIGTERM, not SIGINT: a non-interactive shell starts background jobs with SIGINT ignored.)
for _ in $(seq 200); do
  [[ $(psql -X -At -c "SELECT count(*) FROM ${TABLE}_queue WHERE lock_name = 'wait-job'") -gt 0 ]] && break
  sleep 0.05
done
kill -TERM "$waiter"
wait_exit "$waiter" 30
equal "$EXIT" "143" "SIGTERM while waiting: 128+15"
contains "$WORK/waiter.err" "interrupted by SIGTERM while waiting" "the waiter was waiting"
equal "$(value "$wait_file" pgmutex_run_exit_code 'lock="wait-job"')" "143" "file says 143"
equal "$(value "$wait_file" pgmutex_run_fence 'lock="wait-job"')" "0" "no fence"
kill -TERM "$blocker"
wait_exit "$blocker" 10

# A server that accepts the connection and never answers: pgmutex is connecting.
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1])); __import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
c, _ = s.accept(); open(sys.argv[2], "w").write("accepted"); time.sleep(60)' "$WORK/port" "$WORK/accepted" &
silent=$!
background_pids+=("$silent")
wait_for_file "$WORK/port"
connect_file="$WORK/textfile/connect.prom"
"$PGMUTEX" run --table "$TABLE" --lock connect-job --metrics-file "$connect_file" \
  --dsn "host=127.0.0.1 port=$(cat "$WORK/port") connect_timeout=30" -- true >/dev/null 2>&1 &
connecting=$!
background_pids+=("$connecting")
wait_for_file "$WORK/accepted"
kill -TERM "$connecting"
wait_exit "$connecting" 30
equal "$EXIT" "143" "SIGTERM while connecting: 128+15"
valid "$connect_file" "connecting metrics file"
equal "$(value "$connect_file" pgmutex_run_exit_code 'lock="connect-job"')" "143" "file says 143"
equal "$(grep -c '^pgmutex_run_lock_outcome{.*} 1$' "$connect_file")" "0" "no outcome: no answer came"
kill "$silent"; wait "$silent" 2>/dev/null

# --- node_exporter reads the files -------------------------------------------
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
prometheus-node-exporter --web.listen-address="127.0.0.1:$port" --collector.disable-defaults --collector.textfile \
  --collector.textfile.directory="$WORK/textfile" >"$WORK/node_exporter.log" 2>&1 &
exporter=$!
background_pids+=("$exporter")
scraped=0
for _ in $(seq 200); do
  if curl -sf "http://127.0.0.1:$port/metrics" -o "$WORK/scrape"; then scraped=1; break; fi
  sleep 0.05
done
((scraped)) && pass "node_exporter answers on 127.0.0.1:$port" || fail "node_exporter: $(cat "$WORK/node_exporter.log")"
# node_exporter sorts labels by name.
contains "$WORK/scrape" "pgmutex_run_exit_code{instance=\"$ok_instance\",lock=\"ok-job\"} 3" "scraped: exit code 3"
contains "$WORK/scrape" "pgmutex_run_fence{instance=\"$ok_instance\",lock=\"ok-job\"} $ok_fence" "scraped: the fence"
contains "$WORK/scrape" "pgmutex_run_lock_outcome{instance=\"contender\",lock=\"held-job\",outcome=\"taken\"} 1" "scraped: taken"
contains "$WORK/scrape" "pgmutex_run_exit_code{instance=\"contender\",lock=\"held-job\"} 75" "scraped: 75"
matches "$WORK/scrape" "^pgmutex_run_exit_code\{instance=\"[^\"]*\",lock=\"lost-job\"\} 70$" "scraped: 70"
contains "$WORK/scrape" "node_textfile_scrape_error 0" "the textfile collector read every file"
kill -TERM "$exporter"; wait "$exporter" 2>/dev/null

finish
