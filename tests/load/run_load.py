#!/usr/bin/env python3
"""Load with faults: WORKERS processes x LOCKS locks x HOLDS holds against one server.

    scripts/with-postgres tests/load/run_load.py build/tests/load/load_worker [--workers 16 --locks 4 --holds 1000]

While the workers run, the driver SIGKILLs a worker every KILL_EVERY seconds
on average, half the time one that holds a lock (and starts it again: it
resumes after its last completed hold) and terminates a random half of the workers' server connections
(pg_terminate_backend) every STORM_EVERY seconds on average.

Each hold writes its start and end to load_holds, whose trigger rejects a
fence lower than the highest it accepted for that lock and records the
attempt in load_violations. At the end it checks, and prints with the figures:
  - 0 violations;
  - nothing lost: every (worker, lock, seq) completed exactly once;
  - no overlapping holds per lock: completed holds [start, end], and the holds
    of SIGKILLed workers that never ended [start, death]; holds abandoned after
    a lost lease are left out (the fence trigger is what guards them), and counted;
  - fences increase with the start of the holds, per lock.
Exits 0 if all hold, 1 otherwise.
"""
import argparse
import os
import random
import signal
import subprocess
import sys
import time

SCHEMA = """
DROP TABLE IF EXISTS load_holds, load_fence, load_violations, load_events;
CREATE TABLE load_holds (
  lock_name TEXT NOT NULL, worker INT NOT NULL, seq INT NOT NULL, fence BIGINT NOT NULL,
  pid INT NOT NULL, start_ns BIGINT NOT NULL, end_ns BIGINT, reclaimed BOOLEAN NOT NULL,
  PRIMARY KEY (lock_name, worker, seq, fence));
CREATE TABLE load_fence (lock_name TEXT PRIMARY KEY, max_fence BIGINT NOT NULL);
CREATE TABLE load_violations (lock_name TEXT, worker INT, seq INT, fence BIGINT, max_fence BIGINT,
  at TIMESTAMPTZ DEFAULT clock_timestamp());
CREATE TABLE load_events (worker INT, pid INT, kind TEXT, lock_name TEXT, fence BIGINT, at_ns BIGINT);
-- The fenced resource: a write with a fence lower than the highest accepted
-- for its lock is rejected (the row is not written) and recorded.
CREATE FUNCTION load_check_fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE highest BIGINT;
BEGIN
  INSERT INTO load_fence VALUES (NEW.lock_name, NEW.fence) ON CONFLICT (lock_name) DO NOTHING;
  SELECT max_fence INTO highest FROM load_fence WHERE lock_name = NEW.lock_name FOR UPDATE;
  IF NEW.fence < highest THEN
    INSERT INTO load_violations(lock_name, worker, seq, fence, max_fence)
      VALUES (NEW.lock_name, NEW.worker, NEW.seq, NEW.fence, highest);
    RETURN NULL;
  END IF;
  UPDATE load_fence SET max_fence = NEW.fence WHERE lock_name = NEW.lock_name;
  RETURN NEW;
END $$;
CREATE TRIGGER load_fenced BEFORE INSERT OR UPDATE ON load_holds
  FOR EACH ROW EXECUTE FUNCTION load_check_fence();
"""


def psql(sql):
    pgbin = os.environ.get("PGMUTEX_TEST_PGBIN", "/usr/lib/postgresql/15/bin")
    out = subprocess.run([os.path.join(pgbin, "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-F", " ", "-c", sql],
                         capture_output=True, text=True)
    if out.returncode != 0:  # say why: CI once showed only "exit status 2"
        sys.exit(f"run_load: psql exited {out.returncode} on: {sql}\n{out.stderr}")
    return out.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("worker")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--locks", type=int, default=4)
    parser.add_argument("--holds", type=int, default=1000)
    parser.add_argument("--kill-every", type=float, default=3.0)
    parser.add_argument("--storm-every", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--time-limit", type=float, default=900)
    parser.add_argument("--logs", default=".")
    a = parser.parse_args()
    if "PGHOST" not in os.environ:
        print("run_load: no server: run it under scripts/with-postgres", file=sys.stderr)
        return 1
    rng = random.Random(a.seed)
    print(f"run_load: seed {a.seed}: {a.workers} workers x {a.locks} locks x {a.holds} holds", flush=True)

    psql(SCHEMA)
    subprocess.run([a.worker, "schema"], check=True)

    os.makedirs(a.logs, exist_ok=True)
    log = open(os.path.join(a.logs, "load_workers.log"), "w")
    procs = {}
    deaths = {}  # pid -> monotonic ns once it was dead (SIGKILLed)
    lives = 0

    def start(w):
        nonlocal lives
        lives += 1
        procs[w] = subprocess.Popen([a.worker, "run", str(w), str(a.locks), str(a.holds)], stdout=log, stderr=log)

    began = time.monotonic()
    for w in range(a.workers):
        start(w)
    kills = storms = terminated = 0
    failed_workers = []
    next_kill = began + rng.expovariate(1 / a.kill_every)
    next_storm = began + rng.expovariate(1 / a.storm_every)
    next_report = began + 60

    def progress():
        # How far it got, and how many connections the workers have: a run
        # that stalls shows where (CI once saw only "not done after 900 s").
        done, connections = psql("SELECT (SELECT count(*) FROM load_holds WHERE end_ns IS NOT NULL), "
                                 "(SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgmutex_load')").split()
        return f"{done} of {a.workers * a.locks * a.holds} holds completed, {connections} worker connections"

    while procs:
        now = time.monotonic()
        if now >= next_report:
            print(f"run_load: {now - began:.0f} s: {progress()}", flush=True)
            next_report += 60
        if now - began > a.time_limit:
            print(f"run_load: FAIL: not done after {a.time_limit:.0f} s: {progress()}", flush=True)
            for p in procs.values():
                p.kill()
            return 1
        for w, p in list(procs.items()):
            rc = p.poll()
            if rc is None:
                continue
            del procs[w]
            if rc != 0:
                failed_workers.append((w, rc))
        if now >= next_kill and procs:
            # Half the kills aim at a holder (its lock must be reclaimed), half at any worker.
            w = rng.choice(sorted(procs))
            if rng.random() < 0.5:
                holders = [int(i.split("-")[0][1:]) for i in psql("SELECT instance_id FROM mutex_lock").split()
                           if i.startswith("w")]
                holders = [h for h in holders if h in procs]
                if holders:
                    w = rng.choice(sorted(holders))
            p = procs[w]
            p.send_signal(signal.SIGKILL)
            p.wait()
            deaths[p.pid] = time.monotonic_ns()  # ends no later than this: any hold of it ended by now
            kills += 1
            start(w)
            next_kill = now + rng.expovariate(1 / a.kill_every)
        if now >= next_storm:
            n = psql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                     "WHERE application_name = 'pgmutex_load' AND pid <> pg_backend_pid() AND random() < 0.5")
            terminated += int(n.strip() or 0)
            storms += 1
            next_storm = now + rng.expovariate(1 / a.storm_every)
        time.sleep(0.02)
    elapsed = time.monotonic() - began
    log.close()

    # --- checks
    problems = []
    for w, rc in failed_workers:
        problems.append(f"worker {w} exited {rc} (see {log.name})")
    violations = int(psql("SELECT count(*) FROM load_violations").strip())
    if violations:
        problems.append(f"{violations} fence violations:\n" + psql("SELECT * FROM load_violations LIMIT 10"))
    completed = int(psql("SELECT count(*) FROM load_holds WHERE end_ns IS NOT NULL").strip())
    expected = a.workers * a.locks * a.holds
    dup = psql("SELECT lock_name, worker, seq, count(*) FROM load_holds WHERE end_ns IS NOT NULL "
               "GROUP BY 1, 2, 3 HAVING count(*) > 1 LIMIT 10")
    if dup.strip():
        problems.append("holds completed more than once:\n" + dup)
    if completed != expected:
        problems.append(f"{completed} holds completed, expected {expected}")
    missing = psql(f"SELECT count(*) FROM generate_series(0, {a.workers - 1}) w, generate_series(0, {a.locks - 1}) k, "
                   f"generate_series(0, {a.holds - 1}) s WHERE NOT EXISTS (SELECT 1 FROM load_holds h WHERE "
                   "h.worker = w AND h.lock_name = 'load_' || k AND h.seq = s AND h.end_ns IS NOT NULL)").strip()
    if missing != "0":
        problems.append(f"{missing} holds never completed")

    # Holds abandoned after a lost lease or a rejected write (the worker recorded which).
    given_up = set(tuple(l.split(" ")) for l in psql("SELECT lock_name, fence FROM load_events WHERE kind IN ('lost', 'rejected')").split("\n") if l)
    rows = psql("SELECT lock_name, fence, pid, start_ns, coalesce(end_ns, -1), reclaimed FROM load_holds").split("\n")
    by_lock = {}
    abandoned = reclaims = killed_holds = 0
    for line in rows:
        if not line:
            continue
        lock, fence, pid, start_ns, end_ns, reclaimed = line.split(" ")
        fence, pid, start_ns, end_ns = int(fence), int(pid), int(start_ns), int(end_ns)
        reclaims += reclaimed == "t"
        if end_ns < 0:
            if pid in deaths and (lock, str(fence)) not in given_up:
                end_ns = deaths[pid]
                killed_holds += 1
            else:
                abandoned += 1  # the lease was lost: the worker stopped writing
                continue
        by_lock.setdefault(lock, []).append((start_ns, end_ns, fence))
    overlaps = 0
    for lock, spans in by_lock.items():
        spans.sort()
        for (s0, e0, f0), (s1, e1, f1) in zip(spans, spans[1:]):
            if s1 < e0:
                overlaps += 1
                if overlaps <= 5:
                    problems.append(f"{lock}: hold fence {f1} started {(e0 - s1) / 1e6:.3f} ms before hold fence {f0} ended")
            if f1 <= f0:
                problems.append(f"{lock}: fence {f1} started after fence {f0}")
    events = dict(
        (k, int(n)) for k, n in (l.split(" ") for l in psql("SELECT kind, count(*) FROM load_events GROUP BY 1").split("\n") if l))

    print(f"run_load: {completed} holds completed of {expected} in {elapsed:.1f} s ({completed / elapsed:.0f} holds/s); "
          f"{lives} worker lives, {kills} SIGKILLs ({killed_holds} between a hold's start and end), {storms} pg_terminate_backend storms "
          f"terminating {terminated} connections; {reclaims} stale locks reclaimed; {events.get('lost', 0)} leases lost "
          f"and {abandoned} holds abandoned; {events.get('rejected', 0)} writes rejected by the fence; "
          f"{events.get('release_failed', 0)} releases failed (the row went stale); {violations} fence violations; {overlaps} overlapping holds", flush=True)
    for p in problems:
        print("run_load: FAIL: " + p, flush=True)
    if problems:
        print(f"run_load: replay with --seed {a.seed} (the fault schedule; the interleaving differs)", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
