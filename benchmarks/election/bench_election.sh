#!/usr/bin/env bash
# benchmarks/election/bench_election.sh BUILDDIR [CHANGES [HANDOFFS [OBSERVERS [CYCLES]]]]
#
# Leader election's figures (issue 18) against etcd, in one run: starts a throwaway Postgres
# (scripts/with-postgres, pg_stat_statements loaded) and etcd 3.4 on loopback
# (benchmarks/queue/etcd.sh), runs BUILDDIR/benchmarks/postgres/election_bench (observer
# latency, resign -> successor next to the mutex's handoff, statements per change with
# OBSERVERS observers) and benchmarks/election/etcd_elect.py (etcdctl elect / elect -l), and
# prints a table of p50/p90 with the ratios. Defaults: 200 200 20 50. Run it under `nice`.
# Build first: ninja -C BUILDDIR benchmarks/postgres/election_bench
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
[[ $# -ge 1 ]] || { echo "usage: $0 BUILDDIR [CHANGES [HANDOFFS [OBSERVERS [CYCLES]]]]" >&2; exit 2; }
builddir=$(realpath "$1")
changes=${2:-200} handoffs=${3:-200} observers=${4:-20} cycles=${5:-50}
if [[ -z "${BENCH_ELECTION_INSIDE_POSTGRES:-}" ]]; then
  export BENCH_ELECTION_INSIDE_POSTGRES=1
  exec "$repo/scripts/with-postgres" "$0" "$builddir" "$changes" "$handoffs" "$observers" "$cycles"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-election.XXXXXX")
etcd_pid=""
# shellcheck source=../queue/etcd.sh
source "$repo/benchmarks/queue/etcd.sh"
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local rc=$?
  [[ -z "$etcd_pid" ]] || stop_pid "$etcd_pid"
  rm -rf "$tmp"
  return "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ALTER SYSTEM: with-postgres's own settings are in postgresql.auto.conf (as queue_handoff.sh).
psql -X -q -d postgres -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'" \
  -c "ALTER SYSTEM SET max_connections = 100"
$PGMUTEX_TEST_PGCTL restart -m fast >/dev/null
start_etcd

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
echo "bench_election: $(date -u +%Y-%m-%dT%H:%M:%SZ), load average $load_start, $(nproc) cores, niceness $(nice)," \
  "Postgres $(psql -XAtq -d postgres -c 'SHOW server_version'), etcd $(/usr/bin/etcd --version | awk '/etcd Version/ {print $3}')"
"$builddir/benchmarks/postgres/election_bench" "$changes" "$handoffs" "$observers" "$cycles" | tee "$tmp/out.txt"
python3 "$here/etcd_elect.py" --changes "$changes" --handoffs "$handoffs" | tee -a "$tmp/out.txt"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$tmp/out.txt" <<'PY'
import sys
f = {}
for line in open(sys.argv[1]):
    if line.startswith("FIGURE "):
        _, name, p50, p90, n = line.split()
        f[name] = (float(p50), float(p90), n)
def ms(name):
    if name not in f:
        return "n/a", "n/a"
    return f"{f[name][0] / 1000:.2f}", f"{f[name][1] / 1000:.2f}"
def ratio(a, b):
    if a not in f or b not in f or f[b][0] == 0:
        return "n/a"
    return f"{f[a][0] / f[b][0]:.2f}"
rows = [
    ("observer hears a new leader (campaign returned -> next() returned; etcd: campaigner's line -> listener's line), right after a vacancy",
     "observer_elected_us", "etcd_observer_elected_us"),
    ("the same, etcd's campaign 300 ms after the vacancy", None, "etcd_observer_elected_settled_us"),
    ("observer hears a proclaim (proclaim() returned -> next() returned; etcdctl has none)", "observer_proclaimed_us", None),
    ("observer hears a vacancy (resign() returned -> next() returned; elect -l prints none)", "observer_vacated_us", None),
    ("resign -> successor leads (resign() called / kill -INT -> the waiting campaign returned / printed)",
     "resign_called_to_successor_us", "etcd_resign_to_successor_us"),
    ("resign() returned -> successor's campaign() returned", "resign_returned_to_successor_us", None),
    ("the queue's handoff: release() called -> next acquire() returned (same run)", "release_called_to_next_acquire_us", None),
    ("the queue's handoff: release() returned -> next acquire() returned (queue_handoff's figure)", "release_returned_to_next_acquire_us", None),
]
print()
print("| measurement | pgmutex p50 ms | pgmutex p90 ms | etcd p50 ms | etcd p90 ms | pgmutex/etcd p50 |")
print("|---|---:|---:|---:|---:|---:|")
for label, p, e in rows:
    pp = ms(p) if p else ("", "")
    ee = ms(e) if e else ("", "")
    print(f"| {label} | {pp[0]} | {pp[1]} | {ee[0]} | {ee[1]} | {ratio(p, e) if p and e else ''} |")
print()
print(f"Ratios in this run: resign->successor / the queue's handoff (both from the call): "
      f"{ratio('resign_called_to_successor_us', 'release_called_to_next_acquire_us')}; "
      f"(both from the return): {ratio('resign_returned_to_successor_us', 'release_returned_to_next_acquire_us')}")
if "statements_per_change_candidate" in f:
    print(f"Statements per change: candidate {f['statements_per_change_candidate'][0]:.2f}, "
          f"all {f['statements_per_change_observers'][2]} observers together {f['statements_per_change_observers'][0]:.2f}")
PY
echo
echo "Load average (1, 5, 15 min): $load_start at the start, $load_end at the end; $(nproc) cores; niceness $(nice)."
