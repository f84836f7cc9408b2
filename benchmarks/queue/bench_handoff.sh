#!/usr/bin/env bash
# benchmarks/queue/bench_handoff.sh [OPTIONS] PGMUTEX_BINARY
#
# Issue 17's handoff benchmark: `pgmutex run --wait` against `etcdctl lock` (etcd 3.4) and
# kazoo's Lock (ZooKeeper 3.8), on this machine, in one run. It starts a throwaway Postgres
# (scripts/with-postgres, pg_stat_statements on), etcd and ZooKeeper on loopback ports below the
# ephemeral range, runs the same workloads against each (queue_workload.py), prints a markdown
# table per measurement (handoff_stats.py; for pgmutex, the server's time per statement too) and
# writes the raw numbers to a JSON file. Every server and client it started is gone when it exits.
#
# Options:
#   --handoffs N        handoffs in the timed run (default 20)
#   --fifo-handoffs M   handoffs in the longer FIFO run (default 100; 0 skips it)
#   --systems LIST      comma-separated subset of pgmutex,etcd,zookeeper (default all three), or
#                       flock too: util-linux's flock(1) on a file, one host and no server, the
#                       floor that every system's handoff shares (its processes' own share)
#   --scenarios LIST    comma-separated subset of handoffs,idle,dead-head (default all three)
#   --spacing S         seconds between the queued waiters' launches (default 0.3)
#   --waiters N         queued waiters in the handoffs scenario (default 10)
#   --json PATH         where the raw numbers go (default ./bench_handoff.json)
#   --no-install        do not run scripts/install-deps --bench first
#   --odd-pgmutex PATH  odd-numbered pgmutex clients run PATH instead: an A/B of two builds
#                       within one run, the handoffs to each reported apart
# Run it under `nice` on a shared machine.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

handoffs=20 fifo_handoffs=100 systems=pgmutex,etcd,zookeeper scenarios=handoffs,idle,dead-head
spacing=0.3 waiters=10 json_out="$PWD/bench_handoff.json" install=1 pgmutex="" odd_pgmutex=""
original_args=("$@")
while [[ $# -gt 0 ]]; do
  case "$1" in
    --handoffs) handoffs=$2; shift 2 ;;
    --fifo-handoffs) fifo_handoffs=$2; shift 2 ;;
    --systems) systems=$2; shift 2 ;;
    --scenarios) scenarios=$2; shift 2 ;;
    --spacing) spacing=$2; shift 2 ;;
    --waiters) waiters=$2; shift 2 ;;
    --json) json_out=$(realpath -m "$2"); shift 2 ;;
    --no-install) install=0; shift ;;
    --odd-pgmutex) odd_pgmutex=$(realpath -m "$2"); shift 2 ;;  # checked below, with a message
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench_handoff: unknown option $1" >&2; exit 2 ;;
    *) pgmutex=$(realpath "$1"); shift ;;
  esac
done
[[ -n "$pgmutex" && -x "$pgmutex" ]] || { echo "usage: $0 [OPTIONS] PGMUTEX_BINARY (see --help)" >&2; exit 2; }
[[ -z "$odd_pgmutex" || -x "$odd_pgmutex" ]] || { echo "bench_handoff: --odd-pgmutex $odd_pgmutex is not executable" >&2; exit 2; }

# Outside with-postgres: install what is missing, then run the rest inside a throwaway Postgres.
# with-postgres acts on a signal only once its command has ended, so the run goes in its own
# session and a signal here is passed to all of it (Postgres, in a session of its own, is then
# stopped by with-postgres).
if [[ -z "${BENCH_HANDOFF_INSIDE_POSTGRES:-}" ]]; then
  [[ $install -eq 0 ]] || "$repo/scripts/install-deps" --bench
  export BENCH_HANDOFF_INSIDE_POSTGRES=1
  setsid "$repo/scripts/with-postgres" "$0" --no-install --json "$json_out" "${original_args[@]}" &
  inside=$!
  trap 'kill -TERM -- "-$inside" 2>/dev/null || true' INT TERM HUP
  while true; do
    set +e
    wait "$inside"
    rc=$?
    set -e
    kill -0 "$inside" 2>/dev/null || exit "$rc"  # else wait was cut short by a trapped signal
  done
fi

python=/usr/bin/python3  # Debian's, where python3-kazoo is installed
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-handoff.XXXXXX")
etcd_pid="" zookeeper_pid="" workload_pid=""

# stop_pid PID and start_etcd (etcd 3.4 on loopback, in "$tmp"): benchmarks/queue/etcd.sh
# shellcheck source=etcd.sh
source "$here/etcd.sh"

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local rc=$?
  # Clients first (their process groups, stopped ones included), then the servers.
  # The workload first: on SIGTERM it stops its own clients (its finally), within 5 s.
  [[ -z "$workload_pid" ]] || stop_pid "$workload_pid"
  # queue_workload.py removes its list once it has reaped them all: what is left is still running.
  local list pgid
  for list in "$tmp"/pgids-*; do
    [[ -f "$list" ]] || continue
    while read -r pgid; do
      [[ -n "$pgid" ]] || continue
      kill -KILL -- "-$pgid" 2>/dev/null || true
      kill -CONT -- "-$pgid" 2>/dev/null || true
    done <"$list"
  done
  [[ -z "$etcd_pid" ]] || stop_pid "$etcd_pid"
  [[ -z "$zookeeper_pid" ]] || stop_pid "$zookeeper_pid"
  wait 2>/dev/null || true
  rm -rf "$tmp"
  return "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log() { echo "bench_handoff: $*" >&2; }

# --- Postgres: pg_stat_statements counts every statement the clients send ----------------------
echo "shared_preload_libraries = 'pg_stat_statements'" >>"$PGMUTEX_TEST_PGDATA/postgresql.conf"
$PGMUTEX_TEST_PGCTL restart -m fast >/dev/null
psql -X -q -d postgres -c "CREATE EXTENSION pg_stat_statements" >/dev/null
# Every client reaches its server over loopback TCP, Postgres included.
export BENCH_PGMUTEX="$pgmutex" BENCH_PGMUTEX_ODD="$odd_pgmutex"
export BENCH_PG_DSN="host=127.0.0.1 port=$PGPORT dbname=pgmutex user=postgres"
"$pgmutex" schema --dsn "$BENCH_PG_DSN" >/dev/null

# --- etcd 3.4 on loopback, metrics on their own port: start_etcd (etcd.sh) ---------------------

# --- ZooKeeper 3.8 standalone on loopback, its own data dir, 4lw mntr on -----------------------
zookeeper_answers() {  # zookeeper_answers PORT WORD: prints the four-letter word's answer
  "$python" - "$1" "$2" <<'EOF'
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2) as c:
    c.sendall(sys.argv[2].encode())
    answer = b""
    while chunk := c.recv(65536):
        answer += chunk
    print(answer.decode())
EOF
}

start_zookeeper() {
  local port
  for _ in 1 2 3; do
    read -r port < <("$python" "$here/free_ports.py" 1)
    rm -rf "$tmp/zookeeper"; mkdir -p "$tmp/zookeeper/data"
    cat >"$tmp/zookeeper/zoo.cfg" <<EOF
tickTime=2000
dataDir=$tmp/zookeeper/data
clientPort=$port
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=mntr,ruok
EOF
    # The Debian jar's manifest names its dependencies; a NOP logger keeps its log quiet.
    java -Xmx256m -Dzookeeper.log.dir="$tmp/zookeeper" -Dzookeeper.jmx.log4j.disable=true \
      -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar \
      org.apache.zookeeper.server.ZooKeeperServerMain "$tmp/zookeeper/zoo.cfg" >"$tmp/zookeeper.log" 2>&1 &
    zookeeper_pid=$!
    for _ in $(seq 150); do
      # ruok answers before the server serves; mntr gives counters only once it does.
      if zookeeper_answers "$port" mntr 2>/dev/null | grep -q '^zk_server_state'; then
        export BENCH_ZK_HOSTS="127.0.0.1:$port"
        log "ZooKeeper $(dpkg-query -W -f='${Version}' zookeeper) on 127.0.0.1:$port"
        return 0
      fi
      kill -0 "$zookeeper_pid" 2>/dev/null || break
      sleep 0.1
    done
    stop_pid "$zookeeper_pid"; zookeeper_pid=""
  done
  cat "$tmp/zookeeper.log" >&2
  log "ZooKeeper did not start (log above)"
  return 1
}

[[ ",$systems," != *,etcd,* ]] || start_etcd
[[ ",$systems," != *,zookeeper,* ]] || start_zookeeper

# --- the workloads: each scenario on each system in turn, so they share the machine's state ---
mkdir -p "$tmp/raw"
IFS=, read -r -a system_list <<<"$systems"
IFS=, read -r -a scenario_list <<<"$scenarios"
failed=0
run() {  # run NAME SYSTEM ARGS...: one scenario on one system
  local name=$1 system=$2; shift 2
  log "$name on $system (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  # In the background, waited for: bash runs a trap only once its foreground child has ended,
  # and a signal must stop the run now (cleanup SIGTERMs the workload, which stops its clients).
  "$python" "$here/queue_workload.py" --system "$system" --spacing "$spacing" --waiters "$waiters" --pgids-file "$tmp/pgids-$name-$system" \
    --workdir "$tmp/work/$name-$system" --out "$tmp/raw/$name-$system.json" "$@" &
  workload_pid=$!
  wait "$workload_pid" || failed=1
  workload_pid=""
}
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for scenario in "${scenario_list[@]}"; do
  for system in "${system_list[@]}"; do
    case "$scenario" in
      handoffs)
        run "handoffs-$handoffs" "$system" --scenario handoffs --handoffs "$handoffs"
        ;;
      idle) run idle "$system" --scenario idle ;;
      dead-head)
        run dead-head-KILL "$system" --scenario dead-head --signal KILL
        run dead-head-STOP "$system" --scenario dead-head --signal STOP
        ;;
      *) log "unknown scenario $scenario"; exit 2 ;;
    esac
  done
  if [[ $scenario == handoffs && $fifo_handoffs -gt 0 ]]; then
    for system in "${system_list[@]}"; do
      run "handoffs-$fifo_handoffs" "$system" --scenario handoffs --handoffs "$fifo_handoffs"
    done
  fi
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

"$python" "$here/handoff_stats.py" --json "$json_out" \
  --meta "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)" --meta "pgmutex=$pgmutex" --meta "odd_pgmutex=$odd_pgmutex" \
  --meta "postgres=$(psql -XAtq -d postgres -c 'SHOW server_version')" \
  --meta "etcd=$(/usr/bin/etcd --version | awk '/etcd Version/ {print $3}')" \
  --meta "zookeeper=$(dpkg-query -W -f='${Version}' zookeeper 2>/dev/null || echo none)" \
  --meta "kazoo=$(dpkg-query -W -f='${Version}' python3-kazoo 2>/dev/null || echo none)" \
  --meta "load_average_start=$load_start" --meta "load_average_end=$load_end" \
  --meta "cores=$(nproc)" --meta "nice=$(nice)" "$tmp"/raw/*.json
if [[ " ${system_list[*]} " == *" pgmutex "* ]]; then
  # Where the server's time went, whole run (every scenario, set-up included): each statement's
  # mean execution, the heaviest first. The handoff's own are the release and the confirm.
  echo
  echo "### pgmutex's statements on the server, whole run (pg_stat_statements: calls, mean and total execution)"
  echo
  echo "| calls | mean µs | total ms | statement (its CTEs, else its start) |"
  echo "|---:|---:|---:|---|"
  psql -XAtq -d postgres -c "SELECT '| ' || s.calls || ' | ' || round((s.mean_exec_time * 1000)::numeric) || ' | '
      || round(s.total_exec_time::numeric) || ' | ' || CASE WHEN s.query LIKE 'EXPLAIN%' THEN 'planned while waiting: ' ELSE '' END
      || coalesce((SELECT 'WITH ' || string_agg(m[1], ', ') FROM regexp_matches(s.query, '(\w+) AS (?:MATERIALIZED )?\(', 'g') AS m),
                  replace(left(regexp_replace(s.query, '\s+', ' ', 'g'), 60), '|', '\|'))
      || ' |' FROM pg_stat_statements AS s JOIN pg_database AS d ON d.oid = s.dbid
    WHERE d.datname = 'pgmutex' ORDER BY s.total_exec_time DESC LIMIT 8"
fi
echo
echo "Load average (1, 5, 15 min): $load_start at the start, $load_end at the end; $(nproc) cores; niceness $(nice)."
echo "Raw numbers: $json_out"
exit $failed
