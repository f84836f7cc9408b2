#!/usr/bin/env python3
# handoff_stats.py --json OUT [--meta KEY=VALUE ...] RAW.json...: turns queue_workload.py's raw
# records into issue 17's figures (handoff median/p90, FIFO as Spearman rho and max overtaking,
# server requests per handoff, idle requests/s, the dead and frozen head's stall), prints one
# markdown table per measurement with pgmutex/etcd beside the medians (and, when flock ran, each
# system's median beyond flock's, the floor), and writes the figures and the raw records together
# to OUT.
import argparse
import json
import statistics
import sys

SYSTEMS = ["pgmutex", "etcd", "zookeeper", "flock"]
TITLES = {"pgmutex": "`pgmutex run --wait`", "etcd": "`etcdctl lock --ttl 10`", "zookeeper": "ZooKeeper (kazoo `Lock`)",
          "flock": "`flock` (the floor: one host, no server)"}
# The counter each system's "server requests" are read from, and the unit it counts (flock has
# no server and no counter: its cells read n/a).
REQUESTS = {"pgmutex": ("statements", "statements"), "etcd": ("grpc_messages_received", "gRPC messages"),
            "zookeeper": ("packets_received", "packets"), "flock": ("none", "(no server)")}


def percentile(values: list[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spearman(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        result = [0.0] * len(values)
        for rank, i in enumerate(order):
            result[i] = float(rank)
        return result
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else None


def handoff_figures(record: dict) -> dict:
    handoffs = record["requested_handoffs"]
    grants = sorted(record["grants"], key=lambda g: g[1])[: handoffs + 1]
    ends = {int(w): t for w, t in record["ends"]}
    # Each handoff: who received it, and its gap from the previous holder's end.
    handed = [(grants[i + 1][0], (grants[i + 1][1] - ends[grants[i][0]]) * 1000.0)
              for i in range(len(grants) - 1) if grants[i][0] in ends]
    gaps_ms = [gap for _, gap in handed]
    arrivals = {int(w): t for w, t in record["arrivals"].items()}
    grant_rank = {w: rank for rank, (w, _) in enumerate(grants)}
    last_grant_time = grants[-1][1]
    # Every waiter that had arrived by the last counted grant: granted, or still waiting then.
    candidates = [w for w, t in arrivals.items() if t <= last_grant_time]
    overtaken = {}
    for w in candidates:
        mine = grant_rank.get(w, float("inf"))
        overtaken[w] = sum(1 for q in grant_rank if arrivals[q] > arrivals[w] and grant_rank[q] < mine)
    granted = [w for w, _ in grants]
    figures = {
        "handoffs": len(gaps_ms),
        "handoff_ms": gaps_ms,
        "handoff_median_ms": statistics.median(gaps_ms) if gaps_ms else None,
        "handoff_p90_ms": percentile(gaps_ms, 0.9) if gaps_ms else None,
        "grant_order": granted,
        "spearman_rho": spearman([arrivals[w] for w in granted], list(range(len(granted)))),
        "max_overtaking": max(overtaken.values()) if overtaken else None,
        "overtaken_waiters": sum(1 for v in overtaken.values() if v > 0),
    }
    # --odd-pgmutex: the handoffs to even- and odd-numbered clients (two builds) apart.
    if record["system"] == "pgmutex" and record.get("odd_pgmutex"):
        for parity, name in ((0, "even"), (1, "odd")):
            mine = [gap for receiver, gap in handed if receiver % 2 == parity]
            figures[f"handoff_median_ms_to_{name}"] = statistics.median(mine) if mine else None
            figures[f"handoffs_to_{name}"] = len(mine)
    figures.update(request_figures(record, handoffs))
    if "whole_run_after" in record:
        before, after = record["whole_run_before"], record["whole_run_after"]
        figures["transactions_per_handoff_whole_run"] = (after["transactions"] - before["transactions"]) / handoffs
        figures["statements_per_handoff_whole_run"] = (after["statements"] - before["statements"]) / handoffs
    return figures


def request_delta(record: dict) -> dict[str, float]:
    before, after = record["window_before"], record["window_after"]
    delta = {k: after[k] - before[k] for k in after}
    if record["system"] == "zookeeper":
        delta["packets_received"] -= record.get("zookeeper_packets_per_read", 0.0)
    return delta


def request_figures(record: dict, per: float) -> dict:
    return {"requests_per_handoff": {k: v / per for k, v in request_delta(record).items()}}


def idle_figures(record: dict) -> dict:
    seconds = record["window_after_time"] - record["window_before_time"]
    return {"idle_seconds": seconds, "waiters": 10,
            "requests_per_second": {k: v / seconds for k, v in request_delta(record).items()}}


def dead_head_figures(record: dict) -> dict:
    grants = sorted(record["grants"], key=lambda g: g[1])
    ends = {int(w): t for w, t in record["ends"]}
    holder_end = ends.get(0)
    figures = {"signal": record["requested_signal"],
               "signal_before_holder_end_ms": (holder_end - record["signalled"]["time"]) * 1000.0
               if holder_end and "signalled" in record else None}
    if len(grants) >= 2 and holder_end is not None:
        figures.update(stall_ms=(grants[1][1] - holder_end) * 1000.0, next_holder=grants[1][0])
    else:
        figures.update(stall_ms=None, next_holder=None, timed_out_after_s=record.get("timed_out_after_s"))
    return figures


def figures_of(record: dict) -> dict:
    if record.get("failure") and not record.get("grants"):
        return {"failure": record["failure"]}
    scenario = record["scenario"]
    result = {"handoffs": handoff_figures, "idle": idle_figures, "dead-head": dead_head_figures}[scenario](record)
    if record.get("failure"):
        result["failure"] = record["failure"]
    return result


def cell(value, fmt="{:.1f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def ratio(a, b) -> str:
    if a is None or not b:
        return "n/a"
    return f"{a / b:.2f}×" if a / b >= 0.1 else f"{a / b:.4f}×"


def section(title: str, rows: list[str]) -> list[str]:
    """A markdown table with one column per system, or nothing when there is no row."""
    if not rows:
        return []
    header = "| | " + " | ".join(TITLES[s] for s in SYSTEMS) + " | pgmutex/etcd |"
    rule = "|---" * (len(SYSTEMS) + 2) + "|"
    return [f"### {title}", "", header, rule] + rows + [""]


def tables(results: dict) -> str:
    """results[key][system] = figures; key = 'handoffs-20', 'idle', 'dead-head-KILL', ..."""
    runs = sorted((k for k in results if k.startswith("handoffs-")), key=lambda k: int(k.split("-")[1]))

    def of(key, system, name, default=None):
        return results[key].get(system, {}).get(name, default)

    handoff_rows, fifo_rows, request_rows = [], [], []
    for key in runs:
        count = int(key.split("-")[1])
        med = {s: of(key, s, "handoff_median_ms") for s in SYSTEMS}
        measured = {s: of(key, s, "handoffs") for s in SYSTEMS}
        handoff_rows.append(
            f"| {count} handoffs: median (p90) | "
            + " | ".join(f"{cell(med[s])} ({cell(of(key, s, 'handoff_p90_ms'))})"
                         + ("" if measured[s] in (None, count) else f" [{measured[s]} measured]") for s in SYSTEMS)
            + f" | {ratio(med['pgmutex'], med['etcd'])} |")
        floor = med["flock"]
        if floor is not None and med["pgmutex"] is not None and med["etcd"] is not None:
            # What each takes beyond the processes' own share (flock's median, same run).
            own = {s: med[s] - floor if med[s] is not None else None for s in SYSTEMS}
            handoff_rows.append(
                f"| {count} handoffs: beyond the floor (median − flock's) | "
                + " | ".join(cell(own[s], "{:.2f}") if s != "flock" else "" for s in SYSTEMS)
                + f" | {ratio(own['pgmutex'], own['etcd'])} |")
        even, odd = of(key, "pgmutex", "handoff_median_ms_to_even"), of(key, "pgmutex", "handoff_median_ms_to_odd")
        if even is not None and odd is not None:
            handoff_rows.append(
                f"| {count} handoffs, pgmutex: to even-numbered clients (PGMUTEX_BINARY, "
                f"{of(key, 'pgmutex', 'handoffs_to_even')}) / to odd-numbered ones (--odd-pgmutex, "
                f"{of(key, 'pgmutex', 'handoffs_to_odd')}) | {cell(even, '{:.2f}')} / {cell(odd, '{:.2f}')} | | | "
                f"{ratio(odd, even)} |")
        fifo_rows.append(
            f"| {count} handoffs: Spearman ρ / max overtaking | "
            + " | ".join(f"{cell(of(key, s, 'spearman_rho'), '{:.2f}')} / {cell(of(key, s, 'max_overtaking'), '{:d}')}"
                         for s in SYSTEMS) + " | |")
        per = {s: of(key, s, "requests_per_handoff", {}).get(REQUESTS[s][0]) for s in SYSTEMS}
        request_rows.append(f"| {count} handoffs | " + " | ".join(f"{cell(per[s])} {REQUESTS[s][1]}" for s in SYSTEMS)
                            + f" | {ratio(per['pgmutex'], per['etcd'])} |")
        tx = of(key, "pgmutex", "requests_per_handoff", {}).get("transactions")
        if tx is not None:
            request_rows.append(f"| {count} handoffs: Postgres transactions committed per handoff (same window; "
                                f"pg_stat_database, which backends flush up to 1 s late) | {cell(tx)} | | | |")
        tx = of(key, "pgmutex", "transactions_per_handoff_whole_run")
        if tx is not None:
            request_rows.append(f"| {count} handoffs: Postgres transactions per handoff (whole run, every backend "
                                f"exited: the first 11 clients' set-up and the exits included) | {cell(tx)} | | | |")

    idle_rows = []
    if "idle" in results:
        per = {s: of("idle", s, "requests_per_second", {}).get(REQUESTS[s][0]) for s in SYSTEMS}
        idle_rows.append("| requests/s | " + " | ".join(f"{cell(per[s])} {REQUESTS[s][1]}/s" for s in SYSTEMS)
                         + f" | {ratio(per['pgmutex'], per['etcd'])} |")
        tx = of("idle", "pgmutex", "requests_per_second", {}).get("transactions")
        if tx is not None:
            idle_rows.append(f"| Postgres transactions committed/s (pg_stat_database, flushed up to 1 s late) "
                             f"| {cell(tx)} | | | |")

    dead_rows = []
    for key in ("dead-head-KILL", "dead-head-STOP"):
        if key not in results:
            continue
        stall = {s: of(key, s, "stall_ms") for s in SYSTEMS}

        def stall_cell(s):
            if s not in results[key]:
                return "n/a"
            if stall[s] is None:
                return "none within 45 s"
            return f"{stall[s]:.0f} (then w{of(key, s, 'next_holder')})"
        what = "SIGKILLed" if key.endswith("KILL") else "SIGSTOPped"
        dead_rows.append(f"| head waiter (w1) {what} 0.1 s before the holder ends | "
                         + " | ".join(stall_cell(s) for s in SYSTEMS) + f" | {ratio(stall['pgmutex'], stall['etcd'])} |")

    out = (section("Handoff: holder's command ends → next command starts (ms)", handoff_rows)
           + section("Grant order against arrival order (FIFO: ρ 1.00, max overtaking 0)", fifo_rows)
           + section("Server requests per handoff (newcomers' set-up included)", request_rows)
           + section("Idle queue: 10 waiters and a sleeping holder, server requests per second over 10 s", idle_rows)
           + section("Dead or frozen head: holder's command ends → next command starts (ms)", dead_rows))
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--meta", action="append", default=[])
    parser.add_argument("raw", nargs="+")
    args = parser.parse_args()
    records = []
    for path in args.raw:
        with open(path) as f:
            records.append(json.load(f))
    results: dict = {}
    for record in records:
        if record["scenario"] == "handoffs":
            key = f"handoffs-{record['requested_handoffs']}"
        elif record["scenario"] == "dead-head":
            key = f"dead-head-{record['requested_signal']}"
        else:
            key = "idle"
        results.setdefault(key, {})[record["system"]] = figures_of(record)
    print(tables(results))
    meta = dict(item.split("=", 1) for item in args.meta)
    with open(args.json, "w") as out:
        json.dump({"meta": meta, "figures": results, "raw": records}, out, indent=1)
    failures = [(r["scenario"], r["system"], r["failure"]) for r in records if r.get("failure")]
    for scenario, system, failure in failures:
        print(f"handoff_stats: {scenario} on {system} failed: {failure}", file=sys.stderr)


if __name__ == "__main__":
    main()
