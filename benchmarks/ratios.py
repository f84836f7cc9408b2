#!/usr/bin/env python3
"""Runs a Google Benchmark program and prints the ratios of its results, all
measured in one run: ratios.py PROGRAM NUMERATOR:DENOMINATOR [...] [-- ARGS]."""
import json, subprocess, sys

args = sys.argv[1:]
extra = args[args.index("--") + 1:] if "--" in args else []
args = args[:args.index("--")] if "--" in args else args
program, pairs = args[0], args[1:]
out = subprocess.run([program, "--benchmark_format=json", "--benchmark_repetitions=5",
                      "--benchmark_report_aggregates_only=true", *extra],
                     check=True, capture_output=True, text=True).stdout
to_ns = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
medians = {b["run_name"]: b["real_time"] * to_ns[b.get("time_unit", "ns")] for b in json.loads(out)["benchmarks"]
           if b.get("aggregate_name") == "median"}
for name, t in medians.items():
    print(f"{name:55s} {t:14.1f} ns (median of 5)")
for pair in pairs:
    num, den = pair.split(":")
    print(f"ratio {num} / {den} = {medians[num] / medians[den]:.2f}")
