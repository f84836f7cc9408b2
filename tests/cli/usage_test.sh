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
usage "missing --" "missing '--'" run --lock job true
usage "missing -- with a flag-like argument" "missing '--'" run --lock job ls -l
usage "nothing after --" "no command after '--'" run --lock job --
usage "missing --lock" "--lock" run -- true
usage "threshold not a number" "'abc' is not a number" run --lock job --alert-threshold abc -- true
usage "threshold nan" "'nan' is not a number" run --lock job --stale-threshold nan -- true
usage "threshold inf" "'inf' is not a number" status --alert-threshold inf
usage "negative grace" "--grace" run --lock job --grace=-1 -- true
usage "timeout not a number" "--timeout" run --lock job --wait --timeout soon -- true
usage "--timeout without --wait" "--wait" run --lock job --timeout 5 -- true
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

expect 0 "--version" "$PGMUTEX" --version
if [[ -n "$EXPECTED_VERSION" ]]; then
  equal "$(cat "$OUT")" "pgmutex $EXPECTED_VERSION" "--version prints the project version"
else
  matches "$OUT" '^pgmutex [0-9]+\.[0-9]+\.[0-9]+' "--version prints a version"
fi

finish
