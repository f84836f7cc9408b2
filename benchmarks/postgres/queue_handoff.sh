#!/usr/bin/env bash
# benchmarks/postgres/queue_handoff.sh BUILDDIR [RELEASES [LINE ...]]: runs queue_handoff (the
# queue's statements per release, FIFO and handoff latency through the library; a LINE is N
# Mutex objects or N/S, N SessionMutex on S Sessions: by default 10, 100, 100/2, 1000/4) in a
# throwaway Postgres with what it needs and with-postgres does not set: pg_stat_statements
# loaded, and room for 100 waiters' connections (max_connections 250). Run it under `nice`.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
[[ $# -ge 1 ]] || { echo "usage: $0 BUILDDIR [RELEASES [N | N/S ...]]" >&2; exit 2; }
builddir=$(realpath "$1")
if [[ -z "${QUEUE_HANDOFF_INSIDE_POSTGRES:-}" ]]; then
  export QUEUE_HANDOFF_INSIDE_POSTGRES=1
  exec "$repo/scripts/with-postgres" "$0" "$builddir" "${@:2}"
fi
# ALTER SYSTEM: with-postgres's own settings are in postgresql.auto.conf, which postgresql.conf cannot override.
psql -X -q -d postgres -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'" \
  -c "ALTER SYSTEM SET max_connections = 250"
$PGMUTEX_TEST_PGCTL restart -m fast >/dev/null
echo "queue_handoff: $(date -u +%Y-%m-%dT%H:%M:%SZ), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores, niceness $(nice)"
"$builddir/benchmarks/postgres/queue_handoff" "${@:2}"
echo "queue_handoff: done $(date -u +%Y-%m-%dT%H:%M:%SZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
