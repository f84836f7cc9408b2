#!/usr/bin/env bash
# check.sh BUILD_DIR SOURCE_DIR: installs the build into a scratch DESTDIR, then
# builds and runs a small consumer through find_package(pgmutex) and through
# pkg-config, as a user of the installed library would; checks the command's
# installed manual pages and bash completion (check_command_docs.sh).
set -euo pipefail
build=$1 source=$2
scratch=$(mktemp -d)
[ -n "${KEEP_SCRATCH:-}" ] || trap 'rm -rf "$scratch"' EXIT
DESTDIR="$scratch/root" meson install -C "$build" --quiet --no-rebuild >/dev/null
option() { meson introspect "$build" --buildoptions | python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]==sys.argv[1]))' "$1"; }
prefix=$(option prefix)
libdir=$(option libdir)
root="$scratch/root$prefix"
export LD_LIBRARY_PATH="$root/$libdir"

# The command's manual pages and bash completion, when the command was built.
if [ -x "$root/$(option bindir)/pgmutex" ]; then
  "$source/check_command_docs.sh" "$root" "$(option bindir)" "$(option mandir)" "$(option datadir)"
fi

cmake -S "$source" -B "$scratch/cmake" -DCMAKE_PREFIX_PATH="$root" >/dev/null
cmake --build "$scratch/cmake" >/dev/null
"$scratch/cmake/consumer"
echo "find_package(pgmutex): consumer built and ran"
if [ -f "$root/$libdir/pkgconfig/pgmutex-postgres.pc" ]; then
  "$scratch/cmake/consumer_postgres"
  echo "find_package(pgmutex), pgmutex::postgres: consumer built and ran"
fi

export PKG_CONFIG_PATH="$root/$libdir/pkgconfig"
flags=$(pkg-config --define-variable=prefix="$root" --cflags --libs pgmutex)
c++ -std=c++20 "$source/consumer.cpp" $flags -o "$scratch/pkg-consumer"
"$scratch/pkg-consumer"
echo "pkg-config pgmutex: consumer built and ran"
if [ -f "$root/$libdir/pkgconfig/pgmutex-postgres.pc" ]; then
  flags=$(pkg-config --define-variable=prefix="$root" --cflags --libs pgmutex-postgres)
  c++ -std=c++20 "$source/consumer_postgres.cpp" $flags -o "$scratch/pkg-consumer-postgres"
  "$scratch/pkg-consumer-postgres"
  echo "pkg-config pgmutex-postgres: consumer built and ran"
fi
