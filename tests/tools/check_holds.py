#!/usr/bin/env python3
"""check_holds.py: judges holders' logs for the HA scenarios (issue 19).

Usage:
    check_holds.py [--window NAME START_US END_US]... [--lost-in NAME MAX] LOG...
    check_holds.py --held [--since US] LOG...

Each LOG line is "MICROSECONDS EVENT LOCK FENCE WHO [DETAIL]" (CLOCK_REALTIME,
shared by every process on the machine), as tests/integration/ha_load.cpp and
the CLI scenario's fenced command write it:
    GRANT  WHO believes it holds LOCK under FENCE from here on
    END    WHO stops believing (it is about to release)
    LOST   WHO learned that its lease is lost (it stops believing)
    KILLED WHO was killed before it could say LOST or END (a command that
           SIGKILL ended): it believed no longer, at the latest; written by
           the one who reaped it, counted apart
    ERROR  an acquire failed (ignored here, counted)

A belief runs from a GRANT to its holder's next END, LOST or KILLED for that
lock and fence; one with none runs to the end of the logs. Per lock, it plays a
fenced resource that accepts a fence only above every fence it accepted, and
checks:
  1. no lower fence comes after a higher one on the same timeline; one from a
     lower timeline (a former primary that still took writes) is rejected by
     the resource, counted and shown as FENCED OUT;
  2. the accepted beliefs never overlap: every holder stops believing (END, or
     LOST: it learned it lost) before the next accepted holder's GRANT.
Violations are printed, and the exit status is 1.

For each --window it prints one line of figures over the beliefs that ended
(LOST or END) or began inside it, per load (a lock's load is its name less a
trailing "-N" or "N": session-haproxy-17 is load session-haproxy):
  lost         LOST events in the window
  reheld_s     for each lock lost in the window: from the window's start to
               its next GRANT; the largest (every lost lock held again)
  longest_free_s  the longest time inside the window that some lock of the
               load was believed held by nobody (after it had been held)
--lost-in NAME LOAD MAX fails if, in window NAME, LOAD (or every load: *)
learned of more than MAX losses; --lost-at-least NAME LOAD MIN if of fewer
than MIN (NAME may be *: every window together).
--held prints, per load, how many locks it believes it holds now, its latest
GRANT's time, and how many of its locks were granted since --since US
("LOAD HELD LAST_GRANT_US LOCKS_GRANTED_SINCE"), and checks nothing.
"""
import argparse
import collections
import sys


def load(paths):
    events = []
    for path in paths:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                parts = line.split(maxsplit=5)
                if len(parts) < 5:
                    sys.exit("%s:%d: not 'MICROSECONDS EVENT LOCK FENCE WHO': %r" % (path, number, line))
                events.append((int(parts[0]), parts[1], parts[2], int(parts[3]), parts[4]))
    events.sort()
    return events


def beliefs_of(events):
    """Per lock, the list of [start, end, fence, who, how_ended] in grant order."""
    per_lock = collections.defaultdict(list)
    open_beliefs = {}
    for t, event, lock, fence, who in events:
        if event == "GRANT":
            belief = [t, None, fence, who, None]
            per_lock[lock].append(belief)
            open_beliefs[(lock, fence, who)] = belief
        elif event in ("END", "LOST", "KILLED"):
            belief = open_beliefs.pop((lock, fence, who), None)
            if belief is not None:
                belief[1], belief[4] = t, event
    return per_lock


def timeline_of(fence):
    """A fence is nextval + (timeline - 1) << 40 (docs/operations/failover.md)."""
    return (fence >> 40) + 1


def load_of(lock):
    """A lock's load: its name less a trailing number (session-haproxy-17: session-haproxy)."""
    return lock.rstrip("0123456789").rstrip("-") or lock


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--window", nargs=3, action="append", default=[], metavar=("NAME", "START_US", "END_US"))
    parser.add_argument("--lost-in", nargs=3, action="append", default=[], metavar=("NAME", "LOAD", "MAX"))
    parser.add_argument("--lost-at-least", nargs=3, action="append", default=[], metavar=("NAME", "LOAD", "MIN"))
    parser.add_argument("--held", action="store_true")
    parser.add_argument("--since", type=int, default=0)
    parser.add_argument("logs", nargs="+")
    args = parser.parse_args()

    events = load(args.logs)
    per_lock = beliefs_of(events)
    if args.held:
        held = collections.Counter()
        last = collections.Counter()
        since = collections.Counter()
        for lock, beliefs in per_lock.items():
            for b in beliefs:
                last[load_of(lock)] = max(last[load_of(lock)], b[0])
                if b[1] is None:
                    held[load_of(lock)] += 1
            if beliefs and beliefs[-1][0] >= args.since:
                since[load_of(lock)] += 1
        for name in sorted(last):
            print(name, held[name], last[name], since[name])
        return 0
    forever = (events[-1][0] if events else 0) + 1
    violations = []
    fenced_out = []
    for lock, beliefs in sorted(per_lock.items()):
        # The fenced resource: it accepts a grant's fence only above every
        # fence it accepted before. pgmutex's fences never go back on one
        # timeline; a grant on a lower timeline than one already accepted is
        # a former primary still taking writes (frozen, then thawed before
        # its Patroni demoted it): the resource rejects it, and it is counted.
        accepted = []
        for b in beliefs:
            if accepted and b[2] <= accepted[-1][2]:
                if timeline_of(b[2]) >= timeline_of(accepted[-1][2]):
                    violations.append("%s: fence %d (%s, at %d) after fence %d (%s, at %d), on the same timeline"
                                      % (lock, b[2], b[3], b[0], accepted[-1][2], accepted[-1][3], accepted[-1][0]))
                else:
                    fenced_out.append("%s: fence %d (timeline %d, %s, at %d) after fence %d (timeline %d)"
                                      % (lock, b[2], timeline_of(b[2]), b[3], b[0], accepted[-1][2],
                                         timeline_of(accepted[-1][2])))
                continue
            accepted.append(b)
        for before, after in zip(accepted, accepted[1:]):
            end = before[1] if before[1] is not None else forever
            if end > after[0]:
                violations.append("%s: %s still believed it held fence %d (until %s) when %s was granted fence %d at %d: %.3f s of overlap"
                                  % (lock, before[3], before[2], before[1] if before[1] else "the end",
                                     after[3], after[2], after[0], (end - after[0]) / 1e6))
    grants = sum(len(b) for b in per_lock.values())
    losses = sum(1 for e in events if e[1] == "LOST")
    killed = sum(1 for e in events if e[1] == "KILLED")
    errors = sum(1 for e in events if e[1] == "ERROR")
    print("check_holds: %d locks, %d grants, %d losses learned, %d holders killed before they could say so, "
          "%d acquire errors, %d grants of a former primary fenced out, %d violations"
          % (len(per_lock), grants, losses, killed, errors, len(fenced_out), len(violations)))
    for f in fenced_out[:10]:
        print("  FENCED OUT " + f)
    for v in violations[:20]:
        print("  VIOLATION " + v)

    limits = collections.defaultdict(list)
    for name, load_name, limit in args.lost_in:
        limits[name].append((load_name, int(limit)))
    failed = bool(violations)
    lost_by_window = {}
    for name, start, end in args.window:
        start, end = int(start), int(end)
        by_load = collections.defaultdict(lambda: {"lost": 0, "reheld": 0.0, "free": 0.0})
        for lock, beliefs in per_lock.items():
            for i, b in enumerate(beliefs):
                figures = by_load[load_of(lock)]
                if b[4] == "LOST" and start <= b[1] <= end:
                    figures["lost"] += 1
                    nxt = beliefs[i + 1][0] if i + 1 < len(beliefs) else None
                    figures["reheld"] = max(figures["reheld"], (nxt - start) / 1e6 if nxt else float("inf"))
                # Time with nobody believing, between this belief's end and the next grant, inside the window.
                if i + 1 < len(beliefs) and b[1] is not None:
                    gap_start, gap_end = max(b[1], start), min(beliefs[i + 1][0], end)
                    if gap_end > gap_start:
                        figures["free"] = max(figures["free"], (gap_end - gap_start) / 1e6)
        print("window %s (%.1f s): %s" % (name, (end - start) / 1e6, "; ".join(
            "%s lost %d, all held again after %s s, longest free %.2f s"
            % (load, f["lost"], "%.2f" % f["reheld"] if f["lost"] else "-", f["free"])
            for load, f in sorted(by_load.items()))))
        lost_by_window[name] = {l: f["lost"] for l, f in by_load.items()}
        for load_name, limit in limits[name]:
            lost = sum(f["lost"] for l, f in by_load.items() if load_name in ("*", l))
            if lost > limit:
                print("  VIOLATION window %s: %s lost %d locks, at most %d allowed" % (name, load_name, lost, limit))
                failed = True
    for name, load_name, least in args.lost_at_least:
        lost = sum(n for w, per_load in lost_by_window.items() if name in ("*", w)
                   for l, n in per_load.items() if load_name in ("*", l))
        if lost < int(least):
            print("  VIOLATION %s lost %d locks in window %s, at least %s expected" % (load_name, lost, name, least))
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
