# Shared by the CLI tests: sourced, never run. Usage in a test:
#   source "$(dirname "$0")/lib.sh" "$@"     # $1: the pgmutex binary
# Every check that fails is counted; `finish` exits non-zero if any did.
set -uo pipefail

PGMUTEX=${1:?"usage: $0 PATH_TO_PGMUTEX [VERSION]"}
EXPECTED_VERSION=${2:-}
TEST_NAME=$(basename "$0" .sh)
failures=0
checks=0

fail() {
  echo "FAIL [$TEST_NAME]: $*" >&2
  failures=$((failures + 1))
}
pass() {
  checks=$((checks + 1))
  echo "ok: $*"
}

[[ -x "$PGMUTEX" ]] || { echo "FAIL [$TEST_NAME]: $PGMUTEX is not an executable" >&2; exit 1; }
# These tests need a real Postgres: without one they fail, they never skip.
if [[ -z "${PGHOST:-}" || -z "${PGPORT:-}" || -z "${PGUSER:-}" || -z "${PGDATABASE:-}" ]]; then
  echo "FAIL [$TEST_NAME]: PGHOST, PGPORT, PGUSER and PGDATABASE must point at a Postgres; run under scripts/with-postgres" >&2
  exit 1
fi
command -v jq >/dev/null || { echo "FAIL [$TEST_NAME]: jq is needed to read --json output (apt-get install jq)" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/pgmutex-cli-$TEST_NAME.XXXXXX")
# Own table per test file, so test programs running in parallel never meet.
TABLE="cli_${TEST_NAME}_$$"
OUT="$WORK/out"
ERR="$WORK/err"
background_pids=()

cleanup() {
  for pid in "${background_pids[@]}"; do kill -KILL -- "-$pid" "$pid" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# pgm SUBCOMMAND ARGS...: pgmutex with this test's table. In the foreground
# only: in the background, $! would be a subshell, not pgmutex; start
# background runs as "$PGMUTEX" run --table "$TABLE" ... &
pgm() {
  local sub=$1
  shift
  "$PGMUTEX" "$sub" --table "$TABLE" "$@"
}

# expect RC DESCRIPTION CMD...: runs CMD, output in $OUT/$ERR, checks the exit code.
expect() {
  local want=$1 what=$2
  shift 2
  "$@" >"$OUT" 2>"$ERR"
  local rc=$?
  if [[ $rc -eq $want ]]; then
    pass "$what (exit $rc)"
  else
    fail "$what: exit $rc, wanted $want; stdout: $(cat "$OUT"); stderr: $(cat "$ERR")"
  fi
}

# contains FILE TEXT DESCRIPTION
contains() {
  if grep -qF -- "$2" "$1"; then pass "$3"; else fail "$3: '$2' not in $(basename "$1"): $(cat "$1")"; fi
}
lacks() {
  if grep -qF -- "$2" "$1"; then fail "$3: '$2' found in $(basename "$1"): $(cat "$1")"; else pass "$3"; fi
}
# matches FILE REGEX DESCRIPTION (extended regex)
matches() {
  if grep -qE -- "$2" "$1"; then pass "$3"; else fail "$3: /$2/ not in $(basename "$1"): $(cat "$1")"; fi
}
equal() {
  if [[ "$1" == "$2" ]]; then pass "$3"; else fail "$3: got '$1', wanted '$2'"; fi
}
line_count() { wc -l <"$1" | tr -d ' '; }

# wait_for_file PATH [SECONDS]: until PATH exists (fails the check on timeout).
wait_for_file() {
  local path=$1 limit=${2:-10} waited=0
  while [[ ! -s "$path" ]]; do
    sleep 0.05
    waited=$((waited + 1))
    if ((waited > limit * 20)); then
      fail "timed out waiting for $path"
      return 1
    fi
  done
}

# wait_exit PID SECONDS: sets EXIT to the exit code of background PID, or to
# 255 after SECONDS (then PID is killed). Not in $(...): only this shell can wait.
wait_exit() {
  local pid=$1 limit=$2 waited=0
  while kill -0 "$pid" 2>/dev/null && [[ $(ps -o stat= -p "$pid") != Z* ]]; do
    sleep 0.05
    waited=$((waited + 1))
    if ((waited > limit * 20)); then
      kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      EXIT=255
      return
    fi
  done
  wait "$pid"
  EXIT=$?
}

now_ms() { date +%s%3N; }
# sleep_past START_MS SECONDS: sleeps until SECONDS have passed since START_MS
# (a check that needs an age past a threshold, whatever the checks before it took).
sleep_past() {
  local left=$(( $1 + $(awk "BEGIN{print int($2 * 1000)}") - $(now_ms) ))
  ((left > 0)) && sleep "$(awk "BEGIN{print $left / 1000}")"
  return 0
}

finish() {
  if ((failures > 0)); then
    echo "$TEST_NAME: $failures check(s) failed, $checks passed" >&2
    exit 1
  fi
  echo "$TEST_NAME: all $checks checks passed"
  exit 0
}

# start_fault_proxy: tests/tools/fault_proxy.py in front of the server; sets
# proxy_port. proxy_mode MODE (pass | freeze | reset | ...) returns once the
# proxy applies it.
start_fault_proxy() {
  : "${PGMUTEX_TEST_TCP_HOST:?run under scripts/with-postgres}"
  local script
  script="$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/fault_proxy.py"
  python3 "$script" --upstream "$PGMUTEX_TEST_TCP_HOST:$PGPORT" --max-lifetime 120 >"$WORK/proxy.out" &
  background_pids+=("$!")
  wait_for_file "$WORK/proxy.out"
  local address control
  read -r _ address _ control <"$WORK/proxy.out"
  proxy_port=${address##*:}
  proxy_control_port=${control##*:}
}
proxy_mode() {
  local reply
  exec 3<>"/dev/tcp/127.0.0.1/$proxy_control_port"
  echo "$1" >&3
  read -r reply <&3
  exec 3<&-
  equal "$reply" "ok $1" "the proxy is in $1 mode"
}
