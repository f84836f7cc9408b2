#!/usr/bin/env python3
# Runs one scenario of issue 17's queue workload against one lock service (pgmutex's CLI,
# etcdctl lock, kazoo's Lock through zk_lock.py, or flock(1) as the floor) and writes what
# happened, raw, as JSON: who arrived when, who was granted when, the server's request counters around the window.
# bench_handoff.sh starts the servers and passes their addresses in the environment;
# handoff_stats.py turns the JSON into figures.
#
# Scenarios (every client runs the same `sh -c` that appends "<waiter> <time>" to starts, sleeps,
# then appends to ends; a waiter's arrival order is its launch order, launches `--spacing` apart
# so each one has queued before the next starts):
#   handoffs  a holder, --waiters queued waiters (10), a newcomer launched each time one is granted, until
#             --handoffs handoffs; counters read just before the first release and 0.5 s after
#             the last grant (so the window holds N releases, N grants and N newcomers' set-up)
#   idle      a holder sleeping, 10 queued waiters; counters read 10 s apart, from 11 s after
#             the last waiter queued
#   dead-head a holder and 3 waiters; the first waiter (the head of a FIFO queue) gets --signal
#             (KILL or STOP) 0.1 s before the holder's command ends; how long until someone starts
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request

IDLE_WAITERS = 10
QUEUED_WAITERS = 10
DEAD_HEAD_WAITERS = 3
GRANT_TIMEOUT_S = 45.0  # longer than any peer's stall (etcd TTL 10 s, ZooKeeper session 10 s)
POLL_S = 0.002
# The idle window opens this long after the last waiter queued: a Postgres backend flushes its
# pg_stat_database counters when idle for 10 s (or at a commit 1 s after its last flush), so the
# waiters' set-up transactions land in the window if it opens sooner. With polling waiters this lag
# was lost in the polls; with the queue's silent waiters it was the whole idle figure (9.5/s).
IDLE_SETTLE_S = 11.0


class Clients:
    """Launches and tracks the waiters: each in its own process group, listed in a file that
    bench_handoff.sh kills from however the run ends."""

    def __init__(self, system: str, lock: str, workdir: str, pgids_file: str):
        self.system, self.lock, self.workdir, self.pgids_file = system, lock, workdir, pgids_file
        self.starts = os.path.join(workdir, "starts")
        self.ends = os.path.join(workdir, "ends")
        self.script = (f'echo "$BENCH_W $(date +%s.%N)" >>{self.starts}; sleep "$BENCH_HOLD"; '
                       f'echo "$BENCH_W $(date +%s.%N)" >>{self.ends}')
        self.procs: dict[int, subprocess.Popen] = {}
        self.arrivals: dict[int, float] = {}
        os.makedirs(os.path.join(workdir, "logs"), exist_ok=True)

    def command(self, waiter: int) -> list[str]:
        shell = ["sh", "-c", self.script]
        if self.system == "pgmutex":
            # bench_handoff.sh --odd-pgmutex: another build for the odd-numbered clients.
            odd = os.environ.get("BENCH_PGMUTEX_ODD", "")
            binary = odd if odd and waiter % 2 == 1 else os.environ["BENCH_PGMUTEX"]
            return [binary, "run", "--lock", self.lock, "--wait", "--quiet",
                    "--dsn", os.environ["BENCH_PG_DSN"], "--"] + shell
        if self.system == "etcd":
            return ["etcdctl", "--endpoints", os.environ["BENCH_ETCD_ENDPOINT"], "lock", "--ttl", "10",
                    self.lock, "--"] + shell
        if self.system == "flock":
            # The floor: a kernel lock on one host (util-linux's flock(1), which runs the command
            # under it as the others do), no server and no network. What it takes is the
            # processes' own share of every system's handoff.
            return ["flock", os.path.join(self.workdir, "lockfile")] + shell
        if self.system == "zookeeper":
            return ["/usr/bin/python3", os.path.join(os.path.dirname(os.path.abspath(__file__)), "zk_lock.py"),
                    os.environ["BENCH_ZK_HOSTS"], "/bench/" + self.lock] + shell
        raise ValueError(self.system)

    def launch(self, waiter: int, hold_s: float) -> None:
        env = dict(os.environ, BENCH_W=str(waiter), BENCH_HOLD=f"{hold_s:.3f}")
        log = open(os.path.join(self.workdir, "logs", f"w{waiter}.log"), "wb")
        self.arrivals[waiter] = time.time()
        proc = subprocess.Popen(self.command(waiter), env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[waiter] = proc
        with open(self.pgids_file, "a") as listed:
            listed.write(f"{proc.pid}\n")

    @staticmethod
    def read(path: str) -> list[tuple[int, float]]:
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        rows = []
        for line in lines:
            parts = line.split()
            if len(parts) == 2:
                rows.append((int(parts[0]), float(parts[1])))
        return rows

    def grants(self) -> list[tuple[int, float]]:
        return self.read(self.starts)

    def wait_for_grants(self, count: int, timeout_s: float = GRANT_TIMEOUT_S) -> list[tuple[int, float]]:
        deadline = time.time() + timeout_s
        while True:
            rows = self.grants()
            if len(rows) >= count:
                return rows
            if time.time() > deadline:
                raise TimeoutError(f"{self.system}: {len(rows)} grants, {count} awaited, after {timeout_s} s")
            time.sleep(POLL_S)

    def signal_waiter(self, waiter: int, signum: int) -> None:
        os.killpg(self.procs[waiter].pid, signum)

    def stop_all(self) -> dict[int, int | None]:
        """SIGTERM every group still running (a waiter cancels its wait), SIGKILL after 5 s."""
        for proc in self.procs.values():
            if proc.poll() is None:
                for signum in (signal.SIGTERM, signal.SIGCONT):
                    try:
                        os.killpg(proc.pid, signum)
                    except ProcessLookupError:
                        pass
        deadline = time.time() + 5
        for proc in self.procs.values():
            try:
                proc.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            try:  # anything the waiter left in its group
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # All reaped: the list bench_handoff.sh kills from must not name reusable ids any more.
        if os.path.exists(self.pgids_file):
            os.remove(self.pgids_file)
        return {w: p.returncode for w, p in self.procs.items()}


def counters(system: str) -> dict[str, float]:
    """The server's request counters now (cumulative)."""
    if system == "pgmutex":
        sql = ("SELECT (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d "
               "ON d.oid = s.dbid WHERE d.datname = 'pgmutex'), "
               "(SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'pgmutex')")
        out = subprocess.run(["psql", "-XAtq", "-F", " ", "-d", "postgres", "-c", sql],
                             check=True, capture_output=True, text=True).stdout.split()
        return {"statements": float(out[0]), "transactions": float(out[1])}
    if system == "etcd":
        text = urllib.request.urlopen(os.environ["BENCH_ETCD_METRICS"], timeout=5).read().decode()
        totals = {"grpc_messages_received": 0.0, "grpc_calls_handled": 0.0}
        for line in text.splitlines():
            if line.startswith("grpc_server_msg_received_total{"):
                totals["grpc_messages_received"] += float(line.rsplit(" ", 1)[1])
            elif line.startswith("grpc_server_handled_total{"):
                totals["grpc_calls_handled"] += float(line.rsplit(" ", 1)[1])
        return totals
    if system == "flock":
        return {}  # no server: nothing is sent
    if system == "zookeeper":
        host, port = os.environ["BENCH_ZK_HOSTS"].rsplit(":", 1)
        import socket
        for _ in range(50):  # until it serves: "not currently serving requests" has no counters
            with socket.create_connection((host, int(port)), timeout=5) as conn:
                conn.sendall(b"mntr")
                text = b""
                while chunk := conn.recv(65536):
                    text += chunk
            match = re.search(r"^zk_packets_received\s+(\d+)", text.decode(), re.M)
            if match:
                return {"packets_received": float(match.group(1))}
            time.sleep(0.1)
        raise RuntimeError(f"ZooKeeper's mntr has no zk_packets_received: {text[:200]!r}")
    raise ValueError(system)


def wait_quiet_postgres() -> None:
    """Until no client backend is connected to the pgmutex database: an exiting backend flushes
    its pg_stat_database counters, so the transactions count is then complete."""
    deadline = time.time() + 15
    while time.time() < deadline:
        out = subprocess.run(["psql", "-XAtq", "-d", "postgres", "-c",
                              "SELECT count(*) FROM pg_stat_activity WHERE datname = 'pgmutex'"],
                             check=True, capture_output=True, text=True).stdout.strip()
        if out == "0":
            time.sleep(0.2)
            return
        time.sleep(0.1)


def run_handoffs(clients: Clients, args, record: dict) -> None:
    initial_hold = args.spacing * args.waiters + 1.5
    record["whole_run_before"] = counters(args.system)
    clients.launch(0, initial_hold)
    (_, holder_start), = clients.wait_for_grants(1)
    for waiter in range(1, args.waiters + 1):
        clients.launch(waiter, 1.0)
        time.sleep(args.spacing)
    # Every queued waiter has set up; read the counters before the holder's release.
    time.sleep(max(0.0, holder_start + initial_hold - 0.4 - time.time()))
    record["window_before"] = counters(args.system)
    record["window_before_time"] = time.time()
    next_waiter = args.waiters + 1
    for grant in range(2, args.handoffs + 2):
        rows = clients.wait_for_grants(grant)
        clients.launch(next_waiter, 1.0)  # the newcomer joins as one wins
        next_waiter += 1
    time.sleep(0.5)
    record["window_after"] = counters(args.system)
    record["window_after_time"] = time.time()
    # The last grant's command ends and its client exits (releasing); then everyone left is cancelled.
    deadline = time.time() + 5
    while time.time() < deadline and len(Clients.read(clients.ends)) < args.handoffs + 1:
        time.sleep(0.01)
    last_holder = clients.grants()[args.handoffs][0]
    try:
        clients.procs[last_holder].wait(3)
    except subprocess.TimeoutExpired:
        pass


def run_idle(clients: Clients, args, record: dict) -> None:
    clients.launch(0, args.spacing * IDLE_WAITERS + IDLE_SETTLE_S + args.idle_seconds + 3.0)
    clients.wait_for_grants(1)
    for waiter in range(1, IDLE_WAITERS + 1):
        clients.launch(waiter, 1.0)
        time.sleep(args.spacing)
    time.sleep(IDLE_SETTLE_S)
    record["window_before"] = counters(args.system)
    record["window_before_time"] = time.time()
    time.sleep(args.idle_seconds)
    record["window_after"] = counters(args.system)
    record["window_after_time"] = time.time()
    if len(clients.grants()) != 1:
        raise RuntimeError(f"{args.system}: the idle holder lost its lock")


def run_dead_head(clients: Clients, args, record: dict) -> None:
    hold = args.spacing * DEAD_HEAD_WAITERS + 1.0
    clients.launch(0, hold)
    (_, holder_start), = clients.wait_for_grants(1)
    for waiter in range(1, DEAD_HEAD_WAITERS + 1):
        clients.launch(waiter, 1.0)
        time.sleep(args.spacing)
    time.sleep(max(0.0, holder_start + hold - 0.1 - time.time()))
    signum = getattr(signal, "SIG" + args.signal)
    clients.signal_waiter(1, signum)
    record["signalled"] = {"waiter": 1, "signal": args.signal, "time": time.time()}
    try:
        clients.wait_for_grants(2)
    except TimeoutError:
        record["timed_out_after_s"] = GRANT_TIMEOUT_S
    deadline = time.time() + 3
    while time.time() < deadline and not Clients.read(clients.ends):
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", required=True, choices=["pgmutex", "etcd", "zookeeper", "flock"])
    parser.add_argument("--scenario", required=True, choices=["handoffs", "idle", "dead-head"])
    parser.add_argument("--handoffs", type=int, default=20)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--signal", choices=["KILL", "STOP"], default="KILL")
    parser.add_argument("--spacing", type=float, default=0.3)
    parser.add_argument("--waiters", type=int, default=QUEUED_WAITERS, help="queued waiters in the handoffs scenario")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--pgids-file", required=True, help="this run's own file: removed once all are reaped")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    os.makedirs(args.workdir, exist_ok=True)
    lock = f"bench-{args.scenario}-{random.randrange(1 << 30):08x}"
    clients = Clients(args.system, lock, args.workdir, args.pgids_file)
    record: dict = {"system": args.system, "scenario": args.scenario, "lock": lock,
                    "spacing_s": args.spacing, "waiters": args.waiters, "load_before": os.getloadavg()}
    if args.scenario == "handoffs":
        record["requested_handoffs"] = args.handoffs
    if args.system == "pgmutex" and os.environ.get("BENCH_PGMUTEX_ODD"):
        record["odd_pgmutex"] = os.environ["BENCH_PGMUTEX_ODD"]
    if args.scenario == "dead-head":
        record["requested_signal"] = args.signal
    failure = None
    # SIGTERM (bench_handoff.sh ending early) still reaches the finally below: every client goes.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        if args.system == "zookeeper":
            # A mntr read is itself a packet received: measure what reading costs, to take it off.
            first, second = counters("zookeeper"), counters("zookeeper")
            record["zookeeper_packets_per_read"] = second["packets_received"] - first["packets_received"]
        {"handoffs": run_handoffs, "idle": run_idle, "dead-head": run_dead_head}[args.scenario](clients, args, record)
    except Exception as error:  # the record is still written: what happened until then
        failure = f"{type(error).__name__}: {error}"
    finally:
        record["exit_codes"] = clients.stop_all()
    if args.system == "pgmutex" and "whole_run_before" in record:
        wait_quiet_postgres()
        record["whole_run_after"] = counters(args.system)
    record.update(arrivals=clients.arrivals, grants=clients.grants(), ends=Clients.read(clients.ends),
                  load_after=os.getloadavg(), failure=failure)
    with open(args.out, "w") as out:
        json.dump(record, out, indent=1)
    if failure:
        sys.exit(f"queue_workload: {failure}")


if __name__ == "__main__":
    main()
