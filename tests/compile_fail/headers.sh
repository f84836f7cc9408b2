#!/usr/bin/env bash
# headers.sh SOURCE_ROOT -- COMPILER ARGS...: every public header compiles on
# its own (it includes what it uses), as the first and only include. The
# headers are checked side by side, one per core.
set -u
root=$1
shift 2
mapfile -t headers < <(cd "$root" && find include backends/*/include -name '*.hpp' | sort)
export PGMUTEX_HEADERS_ROOT=$root
check() {  # check HEADER COMPILER ARGS...
  local header=$1 root=$PGMUTEX_HEADERS_ROOT output; shift
  if output=$(echo "#include \"$root/$header\"" | "$@" -I"$root/include" -I"$root/backends/memory/include" \
                -I"$root/backends/postgres/include" -fsyntax-only -x c++ - 2>&1); then
    echo "ok: $header"
  else
    echo "NOT self-contained: $header"; echo "$output" | head -20
  fi
}
export -f check
results=$(printf '%s\0' "${headers[@]}" | xargs -0 -P "$(nproc)" -I{} bash -c 'check "$@"' _ {} "$@")
echo "$results"
failed=$(grep -c '^NOT self-contained' <<<"$results")
checked=$(grep -c '^ok: \|^NOT self-contained' <<<"$results")
echo "${#headers[@]} headers, $failed not self-contained"
[ "$failed" -eq 0 ] && [ "$checked" -eq "${#headers[@]}" ] && [ "${#headers[@]}" -gt 10 ]
