# benchmarks/queue/etcd.sh: sourced by bench_handoff.sh and benchmarks/election/bench_election.sh.
# Defines stop_pid PID and start_etcd, which starts etcd 3.4 on loopback (metrics on their own
# port) with its data and log in "$tmp", sets etcd_pid and exports BENCH_ETCD_ENDPOINT and
# BENCH_ETCD_METRICS. The caller sets tmp, and may set python (default /usr/bin/python3) and
# define log; the caller stops etcd (stop_pid "$etcd_pid") in its own cleanup.
etcd_helper_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
etcd_pid=${etcd_pid:-}

stop_pid() {  # stop_pid PID: SIGTERM, then SIGKILL after 5 s
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

start_etcd() {
  local client peer metrics
  for _ in 1 2 3; do
    read -r client peer metrics < <("${python:-/usr/bin/python3}" "$etcd_helper_dir/free_ports.py" 3)
    rm -rf "$tmp/etcd"
    /usr/bin/etcd --name bench --data-dir "$tmp/etcd" \
      --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
      --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
      --initial-cluster "bench=http://127.0.0.1:$peer" --initial-cluster-state new \
      --listen-metrics-urls "http://127.0.0.1:$metrics" --metrics basic \
      --logger zap --log-level warn >"$tmp/etcd.log" 2>&1 &
    etcd_pid=$!
    for _ in $(seq 100); do
      if etcdctl --endpoints "127.0.0.1:$client" endpoint health >/dev/null 2>&1; then
        export BENCH_ETCD_ENDPOINT="127.0.0.1:$client" BENCH_ETCD_METRICS="http://127.0.0.1:$metrics/metrics"
        echo "etcd $(/usr/bin/etcd --version | awk '/etcd Version/ {print $3}') on 127.0.0.1:$client (metrics :$metrics)" >&2
        return 0
      fi
      kill -0 "$etcd_pid" 2>/dev/null || break
      sleep 0.1
    done
    stop_pid "$etcd_pid"; etcd_pid=""
  done
  cat "$tmp/etcd.log" >&2
  echo "etcd did not start (log above)" >&2
  return 1
}
