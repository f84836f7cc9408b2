#!/usr/bin/env bash
# pgmutex status --check NAME, as a monitoring plugin: one line on stdout; exit
# 0 OK (held and fresh, or free), 1 WARNING (alert), 2 CRITICAL (expired or
# stale), 3 UNKNOWN (cannot tell). Rows are judged by the rule a reclaim uses:
# the holder's stored stale threshold counts as well as the one given.
source "$(dirname "$0")/lib.sh" "$@"

expect 0 "schema" pgm schema
expect 0 "free: OK" pgm status --check job
equal "$(cat "$OUT")" "PGMUTEX OK - lock 'job' is free" "free: the line"

"$PGMUTEX" run --table "$TABLE" --lock job --heartbeat-interval 0.2 --alert-threshold 1 --stale-threshold 6 -- \
  sh -c 'echo "$PGMUTEX_FENCE $$" >"$0.tmp" && mv "$0.tmp" "$0"; sleep 30' "$WORK/job" >/dev/null 2>&1 &
holder=$!
background_pids+=($holder)
wait_for_file "$WORK/job"
read -r fence shell <"$WORK/job"

expect 0 "held, fresh: OK" pgm status --check job --alert-threshold 5 --stale-threshold 60
matches "$OUT" "^PGMUTEX OK - lock 'job' held by [^ ]+ \(pid $holder on $(hostname): sh -c .*\), fence $fence, heartbeat [0-9]+\.[0-9] s ago$" \
  "OK: holder, pid, host, command, fence, heartbeat age"
equal "$(line_count "$OUT")" "1" "one line"

# The holder stops without a word: its heartbeats stop, its row stays.
kill -KILL "$holder"
killed=$(now_ms)
kill -KILL -- "-$shell" 2>/dev/null
sleep 1.2
expect 1 "past the alert threshold: WARNING" pgm status --check job --alert-threshold 1 --stale-threshold 60
matches "$OUT" "^PGMUTEX WARNING - lock 'job' held by .*past the alert threshold \(1\.0 s\)$" "WARNING: the line"
# Past our stale threshold but not the 6 s the holder stored: an acquire with
# these flags would not reclaim it yet, so neither does the check.
expect 1 "past our stale threshold, not the holder's: WARNING" pgm status --check job --alert-threshold 0.5 --stale-threshold 1
matches "$OUT" "^PGMUTEX WARNING - lock 'job' held by .*past the alert threshold \(0\.5 s\)$" "WARNING, not CRITICAL: the line"
sleep_past "$killed" 6.3
# Past the holder's own threshold but not ours: its lease is over, its row left over.
expect 2 "past the holder's stale threshold, not ours: CRITICAL (expired)" pgm status --check job --alert-threshold 1 --stale-threshold 60
matches "$OUT" "^PGMUTEX CRITICAL - lock 'job' held by .*past its holder's own stale threshold \(6\.0 s\): the holder's lease is over" "CRITICAL (expired): the line"
expect 2 "past both stale thresholds: CRITICAL" pgm status --check job --alert-threshold 0.5 --stale-threshold 1
matches "$OUT" "^PGMUTEX CRITICAL - lock 'job' held by .*past the stale threshold \(6\.0 s\): the holder is presumed dead" "CRITICAL: the line names the larger threshold, the one a reclaim waits for"
expect 0 "plain status still exits 0 for a stale lock" pgm status job --alert-threshold 0.5 --stale-threshold 1

expect 3 "unreachable: UNKNOWN" pgm status --check job --dsn "host=127.0.0.1 port=1 connect_timeout=2"
matches "$OUT" "^PGMUTEX UNKNOWN - cannot connect to Postgres" "UNKNOWN: says why, on stdout"
equal "$(line_count "$OUT")" "1" "UNKNOWN: one line"
expect 3 "missing table: UNKNOWN" "$PGMUTEX" status --check job --table "${TABLE}_none"
contains "$OUT" "pgmutex schema --table" "UNKNOWN: with the fix"
expect 64 "--check without a NAME: usage error" pgm status --check
expect 64 "--check with --json: usage error" pgm status --check job --json

finish
