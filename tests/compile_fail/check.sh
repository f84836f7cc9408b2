#!/usr/bin/env bash
# check.sh CASE EXPECTED -- COMPILER ARGS...
# CASE=good must compile; any other case must fail with EXPECTED in the message.
set -u
case_name=$1 expected=$2
shift 3
source_file=$(dirname "$0")/cases.cpp
output=$("$@" -fsyntax-only "-DCASE_${case_name}" "$source_file" 2>&1)
status=$?
if [ "$case_name" = good ]; then
  [ $status -eq 0 ] && { echo "good: compiles"; exit 0; }
  echo "good case failed to compile:"; echo "$output"; exit 1
fi
if [ $status -eq 0 ]; then
  echo "$case_name: compiled, but must not"; exit 1
fi
if ! grep -qF -- "$expected" <<<"$output"; then
  echo "$case_name: failed to compile, but the message does not name '$expected':"; echo "$output" | head -40; exit 1
fi
echo "$case_name: rejected, naming $expected"
