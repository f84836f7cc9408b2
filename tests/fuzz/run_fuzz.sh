#!/usr/bin/env bash
# tests/fuzz/run_fuzz.sh TARGET SEED_CORPUS SECONDS   (PGMUTEX_FUZZ_SECONDS overrides SECONDS)
# Runs a libFuzzer target for SECONDS, starting from the committed seed corpus
# (read only: what it finds goes to a scratch folder). A crash, leak or failed
# check stops it non-zero and leaves the input as crash-* in the working folder:
# replay it with `TARGET crash-...`.
set -euo pipefail
target=$1 seeds=$2 seconds=${PGMUTEX_FUZZ_SECONDS:-$3}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/pgmutex-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  "$scratch" "$seeds"
