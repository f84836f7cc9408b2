#!/usr/bin/env bash
# CPU seconds to compile one translation unit that includes basic_mutex.hpp, with
# and without the Boost.Hana descriptions (describe/options.hpp, record.hpp),
# the way the build compiles (-std=c++20 -O2 -g, warnings on). Median of N runs
# each (default 5), interleaved so that load on the machine hits both alike.
# Usage: benchmarks/compile_cost.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-std=c++20 -O2 -g -Wall -Wextra -Wpedantic -Iinclude -Ibackends/memory/include -c)
# A TU as a user writes it: the mutex on the in-memory backend, instantiated.
body='pgmutex::testing::Simulation sim; int main() { auto m = sim.instance(pgmutex::Options{.lock_name = "x"}); return m.try_acquire() ? 0 : 1; }'
printf '#include "pgmutex/basic_mutex.hpp"\n#include "pgmutex/testing/simulation.hpp"\n%s\n' "$body" >"$work/plain.cpp"
printf '#include "pgmutex/basic_mutex.hpp"\n#include "pgmutex/testing/simulation.hpp"\n#include "pgmutex/describe/options.hpp"\n#include "pgmutex/describe/record.hpp"\n%s\nconst auto& lock_field = pgmutex::describe::field_of(&pgmutex::Options::lock_name);\n' "$body" >"$work/hana.cpp"
# CPU seconds (user + system) of the compiler: on a shared machine, elapsed time mostly measures the neighbours.
time_one() { /usr/bin/time -f '%U %S' c++ "${flags[@]}" "$1" -o "$work/out.o" 2>&1 >/dev/null | tail -1 | awk '{printf "%.2f", $1 + $2}'; }
plain=() hana=()
for ((i = 0; i < runs; i++)); do
  plain+=("$(time_one "$work/plain.cpp")")
  hana+=("$(time_one "$work/hana.cpp")")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "without Hana: ${plain[*]} s  median $(median "${plain[@]}") s"
echo "with Hana:    ${hana[*]} s  median $(median "${hana[@]}") s"
