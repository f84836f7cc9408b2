#!/usr/bin/env bash
# Usage errors exit 64 with a message that names the problem; --help and --version.
source "$(dirname "$0")/lib.sh" "$@"

usage() {  # usage DESCRIPTION TEXT_IN_STDERR ARGS...
  local what=$1 text=$2
  shift 2
  expect 64 "$what" "$PGMUTEX" "$@"
  contains "$ERR" "$text" "$what: message names the problem"
}

usage "unknown flag" "--bogus" run --lock job --bogus -- true
usage "unknown flag for status" "--nope" status --nope
usage "-c and a command after --" "-c" run --lock job -c 'echo hi' -- true
usage "-c and a command without --" "-c" run --lock job -c 'echo hi' true
usage "unknown flag before a command without --" "--bogus" run --lock job --bogus true
usage "missing --lock" "--lock" run -- true
usage "threshold not a number" "'abc' is not a number" run --lock job --alert-threshold abc -- true
usage "threshold nan" "'nan' is not a number" run --lock job --stale-threshold nan -- true
usage "threshold inf" "'inf' is not a number" status --alert-threshold inf
usage "negative grace" "--grace" run --lock job --grace=-1 -- true
usage "timeout not a number" "--timeout" run --lock job --wait --timeout soon -- true
usage "-n with --wait" "--wait" run --lock job -n --wait -- true
usage "-n with -w" "--no-wait" run --lock job -w 5 -n -- true
usage "-w not a number" "--timeout" run --lock job -w soon -- true
usage "thresholds out of order" "--alert-threshold (20s) must be < --stale-threshold (5s)" \
  run --lock job --alert-threshold 20 --stale-threshold 5 -- true
usage "heartbeat not below alert" "--heartbeat-interval (40s) must be < --alert-threshold (30s)" \
  run --lock job --heartbeat-interval 40 -- true
usage "zero heartbeat" "--heartbeat-interval must be > 0" run --lock job --heartbeat-interval 0 -- true
usage "status thresholds out of order" "--alert-threshold (30s) must be < --stale-threshold (20s)" \
  status --stale-threshold 20
long_name=$(printf 'x%.0s' {1..65})
usage "lock name over 64 characters (run)" "at most 64 characters, got 65" run --lock "$long_name" -- true
usage "lock name over 64 characters (status)" "at most 64 characters, got 65" status "$long_name"
usage "lock name over 64 characters (release)" "at most 64 characters, got 65" release --force "$long_name"
usage "empty lock name" "must not be empty" run --lock "" -- true
usage "lock name not UTF-8" "valid UTF-8" run --lock $'\xff\xfe' -- true
usage "table name not an identifier" "each part an identifier as psql reads it" status --table 'x; drop table y'
usage "release without --force" "--force" release job
usage "release without a name" "name" release --force
usage "no subcommand" "subcommand" 
usage "unknown subcommand" "frobnicate" frobnicate

expect 0 "schema" "$PGMUTEX" schema --table "$TABLE"
# 64 characters is the limit, counted as Postgres counts them (code points).
name64=$(printf 'é%.0s' {1..64})
expect 0 "64 two-byte characters are a valid lock name" "$PGMUTEX" status --table "$TABLE" "$name64"

# A command without "--": the first word that is not run's starts it, and
# every word after it is the command's, options included.
expect 0 "a command without --" pgm run --lock job echo hello
equal "$(cat "$OUT")" "hello" "the command ran"
expect 0 "options after the command word are the command's" pgm run --lock job -q printf '%s\n' --wait -q -w 5
equal "$(cat "$OUT" | tr '\n' ' ')" "--wait -q -w 5 " "the command got --wait -q -w 5"
expect 0 "an option's value is not the command" pgm run --lock job --grace 3 -E 0 echo "$TABLE"
equal "$(cat "$OUT")" "$TABLE" "--grace 3 -E 0 stayed pgmutex's"
expect 0 "-- still works" pgm run --lock job -- echo -q
equal "$(cat "$OUT")" "-q" "the word after -- is the command's"
# -c STRING runs sh -c STRING, as flock -c.
expect 0 "-c runs sh -c" pgm run --lock job -c 'echo "$PGMUTEX_LOCK" | tr j J; exit 0'
equal "$(cat "$OUT")" "Job" "-c ran the string in sh with the lock's environment"
expect 3 "-c gives the string's exit code" pgm run --lock job -c 'exit 3'

# Usage errors come before any connection attempt.
PGHOST=/nonexistent PGPORT=1 expect 64 "usage error wins over an unreachable server" \
  "$PGMUTEX" run --lock job --bogus -- true

expect 0 "--help" "$PGMUTEX" --help
contains "$OUT" "Examples:" "--help shows examples"
contains "$OUT" "pgmutex run --lock nightly-report -- ./report.sh" "--help shows a run example"
contains "$OUT" "flock -n" "--help shows flock-style usage"
contains "$OUT" "Exit codes" "--help lists exit codes"
for sub in run status release schema; do
  expect 0 "$sub --help" "$PGMUTEX" "$sub" --help
  contains "$OUT" "Example" "$sub --help shows examples"
  contains "$OUT" "--dsn" "$sub --help lists --dsn"
done
contains "$OUT" "pgmutex schema" "schema --help example"
"$PGMUTEX" run --help >"$OUT"
for flag in --lock --wait --timeout --alert-threshold --stale-threshold --heartbeat-interval --grace --table; do
  contains "$OUT" "$flag" "run --help lists $flag"
done

# pgmutex help SUBCOMMAND: what SUBCOMMAND --help prints.
"$PGMUTEX" run --help >"$WORK/run-help"
expect 0 "help run" "$PGMUTEX" help run
equal "$(cat "$OUT")" "$(cat "$WORK/run-help")" "help run prints what run --help prints"
expect 0 "help status" "$PGMUTEX" help status
contains "$OUT" "pgmutex status" "help status prints status's help"
expect 0 "help" "$PGMUTEX" help
contains "$OUT" "Exit codes" "help alone prints the overview"
equal "$(cat "$OUT")" "$("$PGMUTEX" --help)" "help prints what --help prints"
usage "help of an unknown subcommand" "frobnicate" help frobnicate

# The usage line names --lock and --, and the -c and no-command forms.
contains "$WORK/run-help" "Usage: pgmutex run --lock NAME [OPTIONS] [--] COMMAND [ARGS...]" "run's usage names --lock and --"
contains "$WORK/run-help" "pgmutex run --lock NAME [OPTIONS] -c STRING" "run's usage gives the -c form"

# Help is wrapped at the width: the terminal's, else $COLUMNS, else 80.
# (The descriptions are wrapped; a flag's name with its default stays whole.)
description_lines() { sed -n '/^Options:/,/^The command gets/p' "$1" | grep -E '^ {30}'; }
COLUMNS=60 "$PGMUTEX" run --help >"$WORK/help60"
equal "$(description_lines "$WORK/help60" | awk 'length > 60' | head -3)" "" "COLUMNS=60: no description line is longer than 60"
COLUMNS=200 "$PGMUTEX" run --help >"$WORK/help200"
matches "$WORK/help200" "print only what changes the exit code.*no warning for heartbeats retried after a restart" "COLUMNS=200: --quiet's help on one line"
env -u COLUMNS "$PGMUTEX" run --help >"$WORK/help80"
equal "$(description_lines "$WORK/help80" | awk 'length > 80' | head -3)" "" "no COLUMNS, not a terminal: wrapped at 80"
lacks "$WORK/help80" "print only what changes the exit code, and a lost lock: nothing when the lock is taken" "at 80 --quiet's help is wrapped"

expect 0 "--version" "$PGMUTEX" --version
if [[ -n "$EXPECTED_VERSION" ]]; then
  equal "$(cat "$OUT")" "pgmutex $EXPECTED_VERSION" "--version prints the project version"
else
  matches "$OUT" '^pgmutex [0-9]+\.[0-9]+\.[0-9]+' "--version prints a version"
fi

finish
