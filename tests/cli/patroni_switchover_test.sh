#!/usr/bin/env bash
# A Patroni switchover under `pgmutex run --wait`: fences never go back, no
# two holders overlap, and the lock is held again after the switch (issue 19).
# Run under tests/tools/with-patroni (--sync or --async), which exports the
# cluster's DSNs and patronictl; lib.sh checks PGHOST etc. (HAProxy's primary).
#
# Four workers loop on one lock with `pgmutex run --wait`, two over the
# multi-host DSN (target_session_attrs=read-write), two through HAProxy. Each
# run's command writes its $PGMUTEX_FENCE to a fenced log: a resource that, as
# docs/command/run.md asks, accepts a fence only if it is not below the highest
# it has accepted (a lower one is logged REJECT), and logs OVERLAP if another
# command is inside it. Meanwhile `patronictl switchover` moves the leader.
source "$(dirname "$0")/lib.sh" "$@"

for v in PGMUTEX_PATRONICTL PGMUTEX_PATRONI_DSN_MULTIHOST PGMUTEX_PATRONI_REPLICATION; do
  [[ -n "${!v:-}" ]] || { echo "FAIL [$TEST_NAME]: $v is not set: run under tests/tools/with-patroni" >&2; exit 1; }
done
command -v flock >/dev/null || { echo "FAIL [$TEST_NAME]: flock is needed (apt-get install util-linux)" >&2; exit 1; }

# Short thresholds, so the failover grace (the stale threshold: no free lock
# is granted on a new timeline before it is over) keeps the test short.
STALE=6
TIMELINE_STEP=$((1 << 40)) # a fence is nextval + (timeline - 1) << 40
LOG="$WORK/fenced.log"
haproxy_dsn="host=$PGHOST port=$PGPORT dbname=$PGDATABASE user=$PGUSER"

cat >"$WORK/fenced-write" <<'EOF'
#!/usr/bin/env bash
# The fenced resource. $1: its log, $2: the worker. Runs as pgmutex run's command.
log=$1 worker=$2
exec 9>>"$log.lock"
flock 9
high=$(cat "$log.high" 2>/dev/null || echo 0)
inside=$(cat "$log.inside" 2>/dev/null || echo 0)
((inside == 0)) || echo "$(date +%s%3N) OVERLAP $PGMUTEX_FENCE $worker" >>"$log"
if ((PGMUTEX_FENCE < high)); then
  echo "$(date +%s%3N) REJECT $PGMUTEX_FENCE $worker" >>"$log"
  exit 3
fi
echo "$PGMUTEX_FENCE" >"$log.high"
echo $((inside + 1)) >"$log.inside"
echo "$(date +%s%3N) ACCEPT $PGMUTEX_FENCE $worker" >>"$log"
flock -u 9
sleep 0.3 # the work done under the lock
flock 9
echo $(($(cat "$log.inside") - 1)) >"$log.inside"
EOF
chmod +x "$WORK/fenced-write"
: >"$LOG"

worker() {
  local id=$1 dsn=$2 rc
  while [[ ! -e "$WORK/stop" ]]; do
    "$PGMUTEX" run --dsn "$dsn" --table "$TABLE" --lock switched --wait --timeout 60 \
      --heartbeat-interval 1 --alert-threshold 3 --stale-threshold "$STALE" --grace 1 -q \
      -- "$WORK/fenced-write" "$LOG" "$id" 2>>"$WORK/worker$id.err"
    rc=$?
    echo "$(now_ms) $id $rc" >>"$WORK/runs"
    [[ $rc -eq 0 ]] || sleep 0.2
  done
}

accepted() { awk '$2 == "ACCEPT" { n++ } END { print n + 0 }' "$LOG"; }
# accepted_after MS [WORKER_REGEX]: accepted writes on a later timeline since MS.
accepted_after() {
  awk -v t="$1" -v step="$TIMELINE_STEP" -v w="${2:-.}" \
    '$2 == "ACCEPT" && $1 >= t && $3 >= step * (cur + 1) && $4 ~ w' cur="$old_timeline_index" "$LOG" 2>/dev/null | wc -l
}
leader() { $PGMUTEX_PATRONICTL list -f json 2>/dev/null | jq -r '.[] | select(.Role == "Leader") | .Member'; }

expect 0 "schema creates the table through HAProxy" pgm schema

old_leader=$(leader)
[[ -n "$old_leader" ]] && pass "the cluster has a leader ($old_leader)" || fail "no leader in: $($PGMUTEX_PATRONICTL list)"
old_timeline=$("$PGMUTEX_TEST_PGBIN/psql" -X -At -c "SELECT timeline_id FROM pg_control_checkpoint()")
old_timeline_index=$((old_timeline - 1))

worker 1 "$PGMUTEX_PATRONI_DSN_MULTIHOST" &
background_pids+=("$!")
worker 2 "$PGMUTEX_PATRONI_DSN_MULTIHOST" &
background_pids+=("$!")
worker 3 "$haproxy_dsn" &
background_pids+=("$!")
worker 4 "$haproxy_dsn" &
background_pids+=("$!")
workers=("${background_pids[@]: -4}")

# Some writes before the switch.
for _ in $(seq 1 300); do (($(accepted) >= 6)) && break; sleep 0.1; done
before=$(accepted)
((before >= 6)) && pass "writes go through before the switch ($before accepted)" || fail "only $before writes accepted before the switch"

switch_start=$(now_ms)
candidate=$(for n in $PGMUTEX_PATRONI_NODES; do echo "${n%%:*}"; done | grep -vx "$old_leader" | head -n 1)
expect 0 "patronictl switchover to $candidate" $PGMUTEX_PATRONICTL switchover --leader "$old_leader" --candidate "$candidate" --force
switch_returned=$(now_ms)
new_leader=""
for _ in $(seq 1 300); do
  new_leader=$(leader)
  [[ -n "$new_leader" && "$new_leader" != "$old_leader" ]] && break
  sleep 0.1
done
switch_led=$(now_ms)
equal "$new_leader" "$candidate" "the candidate leads after the switchover"

# Writes on the new timeline, over both routes (bounded wait: the grace is $STALE s).
for _ in $(seq 1 900); do
  (($(accepted_after "$switch_start" '^[12]$') >= 1 && $(accepted_after "$switch_start" '^[34]$') >= 1)) && break
  sleep 0.1
done
touch "$WORK/stop"
for pid in "${workers[@]}"; do wait_exit "$pid" 90; done

first_after=$(awk -v t="$switch_start" -v min=$(((old_timeline_index + 1) * TIMELINE_STEP)) \
  '$2 == "ACCEPT" && $1 >= t && $3 >= min { print $1; exit }' "$LOG")
last_before=$(awk -v t="$switch_start" '$2 == "ACCEPT" && $1 < t { last = $1 } END { print last }' "$LOG")
after_multihost=$(accepted_after "$switch_start" '^[12]$')
after_haproxy=$(accepted_after "$switch_start" '^[34]$')
((after_multihost >= 1)) && pass "the multi-host DSN workers wrote after the switch ($after_multihost)" ||
  fail "no write over the multi-host DSN after the switch"
((after_haproxy >= 1)) && pass "the HAProxy workers wrote after the switch ($after_haproxy)" ||
  fail "no write through HAProxy after the switch"

# The fenced log: fences strictly increase, none rejected, no overlap.
lacks "$LOG" " REJECT " "no lower fence came after a higher one"
lacks "$LOG" " OVERLAP " "no two commands were inside the resource at once"
if awk '$2 == "ACCEPT" { if (seen && $3 <= prev) exit 1; prev = $3; seen = 1 }' "$LOG"; then
  pass "accepted fences strictly increase ($(accepted) writes)"
else
  fail "accepted fences do not strictly increase: $(awk '$2 == "ACCEPT" { printf "%s ", $3 }' "$LOG")"
fi
max_old=$(awk -v s="$TIMELINE_STEP" -v i="$old_timeline_index" '$2 == "ACCEPT" && $3 < s * (i + 1) { m = $3 } END { print m + 0 }' "$LOG")
min_new=$(awk -v s="$TIMELINE_STEP" -v i="$old_timeline_index" '$2 == "ACCEPT" && $3 >= s * (i + 1) { print $3; exit }' "$LOG")
[[ -n "$min_new" ]] && ((min_new > max_old)) && pass "fences after the switch exceed those before ($max_old, then $min_new: timeline $((min_new / TIMELINE_STEP + 1)))" ||
  fail "fences across the switch: highest before $max_old, first after '${min_new}'"
# A clean switchover replicates everything: no holder loses its lock.
lost=$(awk '$3 == 70' "$WORK/runs" | wc -l)
equal "$lost" "0" "no run lost its lock (exit 70) across the switchover"
# The longest stretch without an accepted write: the lock unavailable across the switch.
longest_gap=$(awk '$2 == "ACCEPT" { if (prev && $1 - prev > g) g = $1 - prev; prev = $1 } END { print g + 0 }' "$LOG")
codes=$(awk '{ c[$3]++ } END { for (k in c) printf "%s:%d ", k, c[k] }' "$WORK/runs")

ms_to_s() { awk "BEGIN{printf \"%.2f\", $1 / 1000}"; }
echo "patroni switchover ($PGMUTEX_PATRONI_REPLICATION): $old_leader -> ${new_leader:-?}; patronictl returned after $(ms_to_s $((switch_returned - switch_start))) s," \
  "new leader seen after $(ms_to_s $((switch_led - switch_start))) s; last write before the switch $(ms_to_s $((switch_start - ${last_before:-$switch_start}))) s before it;" \
  "lock held again (first write on the new timeline) after $(ms_to_s $((${first_after:-$switch_start} - switch_start))) s (failover grace: --stale-threshold $STALE s);" \
  "longest time without an accepted write $(ms_to_s "$longest_gap") s; $(accepted) writes accepted, run exit codes $codes"
for i in 1 2 3 4; do [[ -s "$WORK/worker$i.err" ]] && { echo "worker $i stderr:"; sort "$WORK/worker$i.err" | uniq -c | head -n 5; }; done
finish
