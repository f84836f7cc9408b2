#!/usr/bin/env bash
# headers.sh SOURCE_ROOT -- COMPILER ARGS...: every public header compiles on
# its own (it includes what it uses), as the first and only include.
set -u
root=$1
shift 2
mapfile -t headers < <(cd "$root" && find include backends/*/include -name '*.hpp' | sort)
includes=(-I"$root/include" -I"$root/backends/memory/include" -I"$root/backends/postgres/include")
failed=0
for header in "${headers[@]}"; do
  if output=$(echo "#include \"$root/$header\"" | "$@" "${includes[@]}" -fsyntax-only -x c++ - 2>&1); then
    echo "ok: $header"
  else
    echo "NOT self-contained: $header"; echo "$output" | head -20
    failed=$((failed + 1))
  fi
done
echo "${#headers[@]} headers, $failed not self-contained"
[ "$failed" -eq 0 ] && [ "${#headers[@]}" -gt 10 ]
