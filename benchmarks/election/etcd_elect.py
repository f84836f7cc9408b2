#!/usr/bin/env python3
"""etcd's side of benchmarks/election/bench_election.sh: `etcdctl elect` (etcd 3.4) timed by
its output lines, each stamped with time.monotonic() as it arrives on a pipe (a reader thread
per process).

  observer latency: a campaigner `etcdctl elect NAME vK` on a free election and a listener
    `etcdctl elect -l NAME` running throughout; the campaigner's first line (its leadership's
    key; the value follows) -> the listener's key line for vK. The campaigner is then stopped
    with SIGINT (it resigns) and the next started. etcdctl elect prints after an extra Get
    (campaign, then Get its own key, then print); elect -l prints what its watch brings.
  resign -> successor: a leader and one waiting `etcdctl elect` (queued: 2 keys under the
    prefix); kill -INT the leader -> the waiting one's first line.

Prints "FIGURE name p50_us p90_us n" lines, as election_bench does.
"""
import argparse
import os
import signal
import subprocess
import threading
import time


class Proc:
    def __init__(self, args):
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.lines = []  # (monotonic, text)
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in iter(self.p.stdout.readline, b""):
            t = time.monotonic()
            with self.cv:
                self.lines.append((t, raw.decode().rstrip("\n")))
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def wait_lines(self, n, timeout=10.0, pred=None):
        end = time.monotonic() + timeout
        with self.cv:
            while True:
                if pred is None and len(self.lines) >= n:
                    return self.lines[:n]
                if pred is not None:
                    got = pred(self.lines)
                    if got is not None:
                        return got
                left = end - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and pred is None and len(self.lines) < n):
                    raise TimeoutError(f"{self.p.args}: {self.lines}")
                self.cv.wait(left)

    def stop(self, sig=signal.SIGINT):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def percentile(v, f):
    v = sorted(v)
    if not v:
        return 0.0
    pos = f * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def figure(name, v):
    print(f"FIGURE {name} {percentile(v, 0.5):.1f} {percentile(v, 0.9):.1f} {len(v)}")
    print(f"  {name:<44} p50 {percentile(v, 0.5):8.0f} us  p90 {percentile(v, 0.9):8.0f} us  "
          f"min {min(v) if v else 0:8.0f}  max {max(v) if v else 0:8.0f}  (n = {len(v)})", flush=True)


def observer_latency(ctl, changes, settle):
    """Each campaign `settle` s after the previous vacancy."""
    name = "observed" if settle == 0 else "observed-settled"
    listener = Proc(ctl + ["elect", "-l", name])
    time.sleep(0.5)  # the listener's watch is set up (nobody leads: it prints nothing yet)
    latency, seen = [], 0
    for k in range(changes):
        v = f"v{k}"
        c = Proc(ctl + ["elect", name, v])
        t_c = c.wait_lines(2)[0][0]

        def find(lines, v=v):
            for i in range(max(seen, 1), len(lines)):
                if lines[i][1] == v:
                    return i
            return None

        i = listener.wait_lines(0, pred=find)
        latency.append((listener.lines[i - 1][0] - t_c) * 1e6)
        seen = i + 1
        c.stop()
        time.sleep(settle)
    listener.stop(signal.SIGTERM)
    figure_name = "etcd_observer_elected_us" if settle == 0 else "etcd_observer_elected_settled_us"
    print(f"etcd observer latency: {changes} terms, `etcdctl elect` -> `etcdctl elect -l`, "
          f"the campaigner started {settle * 1000:.0f} ms after the previous one exited")
    figure(figure_name, latency)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", default=os.environ.get("BENCH_ETCD_ENDPOINT"))
    ap.add_argument("--changes", type=int, default=200)
    ap.add_argument("--handoffs", type=int, default=200)
    a = ap.parse_args()
    ctl = ["etcdctl", "--endpoints", a.endpoint]

    # Observer latency: each campaign right after the previous vacancy (as election_bench's),
    # then settled, 300 ms after it. After a vacancy, elect -l watches the prefix from the
    # revision it read; etcd's mvcc store syncs such a watcher in a loop (every 100 ms).
    for settle in (0.0, 0.3):
        observer_latency(ctl, a.changes, settle)

    # Resign -> successor.
    leader = Proc(ctl + ["elect", "handoff", "a0"])
    leader.wait_lines(2)
    handoff = []
    for k in range(a.handoffs):
        w = Proc(ctl + ["elect", "handoff", f"a{k + 1}"])
        end = time.monotonic() + 10
        while time.monotonic() < end:  # the successor's key is in line
            keys = subprocess.run(ctl + ["get", "--prefix", "--keys-only", "handoff/"], capture_output=True,
                                  text=True).stdout.split()
            if len(keys) >= 2:
                break
            time.sleep(0.005)
        time.sleep(0.001)
        t0 = time.monotonic()
        leader.p.send_signal(signal.SIGINT)
        t1 = w.wait_lines(1)[0][0]
        handoff.append((t1 - t0) * 1e6)
        leader.stop()
        leader = w
    leader.stop()
    print(f"etcd resign -> successor: {a.handoffs} handoffs, kill -INT the leading `etcdctl elect` -> "
          "the waiting one's first line")
    figure("etcd_resign_to_successor_us", handoff)


if __name__ == "__main__":
    main()
