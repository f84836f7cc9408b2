#!/usr/bin/env bash
# pgmutex status, as text and as JSON: states ok, alert, expired and stale.
source "$(dirname "$0")/lib.sh" "$@"

expect 0 "schema" pgm schema
expect 0 "status with no locks" pgm status
contains "$OUT" "no locks held in table $TABLE" "text says nothing is held"
expect 0 "status --json with no locks" pgm status --json
equal "$(jq -c '.locks' "$OUT")" "[]" "json: empty list"
equal "$(jq -r '.table' "$OUT")" "$TABLE" "json: the table"
equal "$(jq -r '.alert_threshold, .stale_threshold' "$OUT" | tr '\n' ' ')" "30 600 " "json: default thresholds"
expect 0 "status of a free lock" pgm status free-lock
contains "$OUT" "lock 'free-lock' is not held" "text: free lock"

# Two holders: one alive (heartbeating every 0.2 s), one that will be killed.
start_holder() {  # LOCK STALE_THRESHOLD: writes "instance fence pid" to $WORK/LOCK
  "$PGMUTEX" run --table "$TABLE" --lock "$1" --heartbeat-interval 0.2 --alert-threshold 1 --stale-threshold "$2" -- \
    sh -c 'echo "$PGMUTEX_INSTANCE $PGMUTEX_FENCE $$" >"$0.tmp" && mv "$0.tmp" "$0"; sleep 30' "$WORK/$1" \
    >/dev/null 2>&1 &
  background_pids+=($!)
  wait_for_file "$WORK/$1"
}
start_holder alive 60
alive_pgmutex=${background_pids[-1]}
start_holder doomed 6
doomed_pgmutex=${background_pids[-1]}
read -r alive_instance alive_fence _ <"$WORK/alive"
read -r doomed_instance doomed_fence doomed_shell <"$WORK/doomed"

expect 0 "status, all ok" pgm status
equal "$(line_count "$OUT")" "3" "a header and two locks"
matches "$OUT" "^LOCK +INSTANCE +FENCE +ACQUIRED_AT +HEARTBEAT_AGE +STATE +QUEUE +HOST +PID +COMMAND$" "text header"
matches "$OUT" "^alive +$alive_instance +$alive_fence +[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z +[0-9]+\.[0-9]s +ok +0 +$(hostname) +$alive_pgmutex +sh -c .*$" "text row: alive, with its host, pid and command"
matches "$OUT" "^doomed +$doomed_instance +$doomed_fence .* ok .*$" "text row: doomed"

expect 0 "status --json, all ok" pgm status --json
equal "$(jq '.locks | length' "$OUT")" "2" "json: two locks"
equal "$(jq -r '.locks[] | select(.lock=="alive") | "\(.instance) \(.fence) \(.state)"' "$OUT")" \
  "$alive_instance $alive_fence ok" "json: instance, fence, state"
equal "$(jq -r '.locks[] | select(.lock=="alive") | "\(.host) \(.pid) \(.command | startswith("sh -c "))"' "$OUT")" \
  "$(hostname) $alive_pgmutex true" "json: the holder's host, pid and command"
# The page's example has the real output's keys, in the real order (docs/command/status.md).
documented=$(awk '/^\$ pgmutex status nightly-report --json$/{on=1; next} on && /^\$ /{exit} on' \
  "$(dirname "$0")/../../docs/command/status.md")
keys='[keys_unsorted, (.locks[0] | keys_unsorted)]'
equal "$(echo "$documented" | jq -c "$keys")" "$(jq -c "$keys" "$OUT")" "status --json has the keys docs/command/status.md shows, in its order"
jq -e '.locks[0].acquired_at | test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$")' "$OUT" >/dev/null &&
  pass "json: acquired_at is ISO 8601 UTC" || fail "json acquired_at: $(jq -r '.locks[0].acquired_at' "$OUT")"
jq -e '.locks[0].seconds_since_heartbeat | type == "number" and . >= 0 and . < 5' "$OUT" >/dev/null &&
  pass "json: seconds_since_heartbeat is a small number" || fail "json seconds: $(cat "$OUT")"

# The doomed holder dies without a word: its heartbeats stop.
kill -KILL "$doomed_pgmutex"
killed=$(now_ms)
kill -KILL -- "-$doomed_shell" 2>/dev/null
sleep 1.5
expect 0 "status: alert" pgm status --alert-threshold 1 --stale-threshold 60
matches "$OUT" "^doomed .* alert .*$" "text: the dead holder is alert"
matches "$OUT" "^alive .* ok .*$" "text: the live holder is still ok"
expect 0 "status --json: alert" pgm status doomed --json --alert-threshold 1 --stale-threshold 60
equal "$(jq -r '.locks[0].state' "$OUT")" "alert" "json: alert"
jq -e '.locks[0].seconds_since_heartbeat >= 1' "$OUT" >/dev/null && pass "json: age past the alert threshold" ||
  fail "json age: $(cat "$OUT")"
# By the rule a reclaim uses: the 6 s the holder stored counts as well as ours.
expect 0 "status: our stale threshold passed, the holder's not" pgm status doomed --alert-threshold 0.5 --stale-threshold 1
matches "$OUT" "^doomed .* alert .*$" "text: alert, not stale, before the holder's own threshold"
sleep_past "$killed" 6.3
expect 0 "status: expired" pgm status --alert-threshold 1 --stale-threshold 60
matches "$OUT" "^doomed .* expired .*$" "text: past the holder's threshold, not ours: expired"
matches "$OUT" "^alive .* ok .*$" "text: the live holder is still ok"
expect 0 "status --json: expired" pgm status doomed --json --alert-threshold 1 --stale-threshold 60
equal "$(jq -r '.locks[0].state' "$OUT")" "expired" "json: expired"
expect 0 "status: stale" pgm status doomed --alert-threshold 0.5 --stale-threshold 1
matches "$OUT" "^doomed .* stale .*$" "text: stale"
expect 0 "status --json: stale" pgm status --json --alert-threshold 0.5 --stale-threshold 1
equal "$(jq -r '.locks[] | select(.lock=="doomed") | .state' "$OUT")" "stale" "json: stale"
equal "$(jq -r '.alert_threshold, .stale_threshold' "$OUT" | tr '\n' ' ')" "0.5 1 " "json: the thresholds used"
expect 0 "status --format prometheus: expired and stale" pgm status doomed --format prometheus --alert-threshold 1 --stale-threshold 60
grep -qE "^pgmutex_lock_state\{.*lock=\"doomed\".*state=\"expired\".* 1$" "$OUT" && pass "prometheus: state expired 1" || fail "prometheus expired: $(cat "$OUT")"
expect 0 "status --format prometheus: stale" pgm status doomed --format prometheus --alert-threshold 0.5 --stale-threshold 1
grep -qE "^pgmutex_lock_state\{.*lock=\"doomed\".*state=\"stale\".* 1$" "$OUT" && pass "prometheus: state stale 1 past the stale threshold" || fail "prometheus stale: $(cat "$OUT")"

# The queue: two runs wait for 'alive', in line behind its holder.
queued() { psql -X -At -c "SELECT count(*) FROM ${TABLE}_queue WHERE lock_name = 'alive'" 2>/dev/null; }
line_pids=()
for who in first second; do
  "$PGMUTEX" run --table "$TABLE" --lock alive --instance-id "$who" --wait --timeout 60 -- true &
  background_pids+=($!)
  line_pids+=($!)
  for _ in $(seq 1 200); do [[ "$(queued)" == "${#line_pids[@]}" ]] && break; sleep 0.05; done
done
equal "$(queued)" "2" "two runs wait in line for 'alive'"
expect 0 "status shows the queue" pgm status alive
matches "$OUT" "^alive .* ok +2 " "text: the lock's QUEUE column counts 2"
matches "$OUT" "^LOCK +POSITION +INSTANCE +WAITED +STATE +HOST +PID$" "text: the waiters' table follows"
matches "$OUT" "^alive +1 +first +[0-9.]+s +waiting +.* [0-9]+$" "text: the first in line, waiting, with its pid"
matches "$OUT" "^alive +2 +second +[0-9.]+s +waiting " "text: the second"
expect 0 "status --json shows the queue" pgm status alive --json
equal "$(jq -r '.locks[0].queue_length' "$OUT")" "2" "json: queue_length 2"
equal "$(jq -r '[.queue[] | "\(.position):\(.instance):\(.state)"] | join(" ")' "$OUT")" "1:first:waiting 2:second:waiting" \
  "json: the queue in order"
expect 0 "status --format prometheus shows the queue" pgm status alive --format prometheus
grep -qE '^pgmutex_lock_queue_length\{lock="alive",.*\} 2$' "$OUT" && pass "prometheus: queue length 2" ||
  fail "prometheus queue length: $(cat "$OUT")"
grep -qE '^pgmutex_queue_waiter_state\{lock="alive",position="1",instance="first",state="waiting"\} 1$' "$OUT" &&
  pass "prometheus: the first waiter's state" || fail "prometheus waiter: $(cat "$OUT")"
promtool check metrics <"$OUT" >"$WORK/promtool" 2>&1 && [[ ! -s "$WORK/promtool" ]] &&
  pass "promtool check metrics is silent on the queue's metrics" || fail "promtool: $(cat "$WORK/promtool")"

kill -TERM "$alive_pgmutex"
wait_exit "$alive_pgmutex" 10
for pid in "${line_pids[@]}"; do
  wait_exit "$pid" 30
  equal "$EXIT" "0" "a waiter in line ran once the holder ended"
done
expect 0 "status after the live holder ended" pgm status alive --json
equal "$(jq -c '.locks' "$OUT")" "[]" "json: the ended holder is gone"

# A heartbeat committed between a status statement's start (its now()) and its
# snapshot carries a later now() than the statement's: its age reads as 0,
# not below (CI once printed "-0.0s"). A row stamped ahead stands in for it.
psql -X -q -c "INSERT INTO $TABLE (lock_name, instance_id, last_heartbeat, acquired_at)
  VALUES ('ahead', 'fresh', now() + interval '10 seconds', now())" >/dev/null
expect 0 "status of a heartbeat newer than the statement" pgm status ahead
matches "$OUT" "^ahead +fresh +[0-9]+ .* 0\.0s +ok " "text: its age is 0.0s"
expect 0 "status --json of a heartbeat newer than the statement" pgm status ahead --json
equal "$(jq -r '.locks[0].seconds_since_heartbeat' "$OUT")" "0" "json: seconds_since_heartbeat is 0"

finish
