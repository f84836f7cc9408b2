#!/usr/bin/env bash
# no_boost.sh SOURCE_ROOT -- COMPILER ARGS...: the hot headers reach no Boost
# header (Hana's descriptions cost ~7 % compile time per TU: BENCHMARKS.md).
set -u
root=$1
shift 2
failed=0
for header in pgmutex/basic_mutex.hpp pgmutex/options.hpp pgmutex/metrics.hpp pgmutex/metrics/prometheus.hpp; do
  included=$(echo "#include \"$header\"" | "$@" -I"$root/include" -H -fsyntax-only -x c++ - 2>&1 >/dev/null | grep -E '^\.+ ')
  if [[ -z "$included" ]]; then
    echo "FAIL: could not list what $header includes"; failed=$((failed + 1))
  elif grep -q '/boost/' <<<"$included"; then
    echo "FAIL: $header includes Boost:"; grep '/boost/' <<<"$included" | head -5; failed=$((failed + 1))
  else
    echo "ok: $header includes $(wc -l <<<"$included") headers, none of Boost"
  fi
done
[ "$failed" -eq 0 ]
