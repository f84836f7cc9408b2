#!/usr/bin/env bash
# Where pgmutex connects (--dsn, PGMUTEX_DSN, PG*), an unreachable server (69),
# a refused login (77), a multi-host DSN whose first host never answers (each
# host has its own connect budget, so the second serves),
# and that no output ever shows a password.
source "$(dirname "$0")/lib.sh" "$@"

: "${PGMUTEX_TEST_PASSWORD_ROLE:?run under scripts/with-postgres (it makes a password role)}"
: "${PGMUTEX_TEST_PASSWORD:?run under scripts/with-postgres}"
: "${PGMUTEX_TEST_TCP_HOST:?run under scripts/with-postgres}"
secret=$PGMUTEX_TEST_PASSWORD
role=$PGMUTEX_TEST_PASSWORD_ROLE
tcp=$PGMUTEX_TEST_TCP_HOST
all_output="$WORK/all-output"
: >"$all_output"
keep() { cat "$OUT" "$ERR" >>"$all_output"; }

# --- a DSN with a password, keyword and URI form ------------------------------
kw_dsn="host=$tcp port=$PGPORT dbname=$PGDATABASE user=$role password=$secret connect_timeout=5"
uri_dsn="postgresql://$role:$secret@$tcp:$PGPORT/$PGDATABASE"
expect 0 "schema with a password DSN" pgm schema --dsn "$kw_dsn"; keep
expect 0 "run with a password DSN" pgm run --lock pw --dsn "$kw_dsn" -- echo ran-with-password; keep
contains "$OUT" "ran-with-password" "the command ran"
expect 0 "status with a password URI" pgm status --dsn "$uri_dsn"; keep
expect 0 "status --json with a password URI" pgm status --json --dsn "$uri_dsn"; keep

"$PGMUTEX" run --table "$TABLE" --lock pw-held --dsn "$uri_dsn" -- sleep 3 >/dev/null 2>&1 &
background_pids+=($!)
sleep 1
expect 75 "taken, with a password URI" pgm run --lock pw-held --dsn "$uri_dsn" -- true; keep
expect 0 "release --force with a password URI" pgm release --force pw-held --dsn "$uri_dsn"; keep

# --- a wrong password: 77 (refused, not unreachable); unreachable servers: 69 ------
wrong="wrong-$secret"
expect 77 "wrong password: 77" pgm status --dsn "host=$tcp port=$PGPORT dbname=$PGDATABASE user=$role password=$wrong"; keep
contains "$ERR" "authentication failed" "says authentication failed"
contains "$ERR" "********" "shows the DSN with the password masked"
unreachable_kw="host=127.0.0.1 port=1 user=$role password=$secret connect_timeout=2"
unreachable_uri="postgresql://$role:$secret@127.0.0.1:1/db?connect_timeout=2"
for sub in "run --lock x" "status" "release --force x" "schema"; do
  # shellcheck disable=SC2086
  if [[ $sub == run* ]]; then
    expect 69 "$sub: unreachable server, keyword DSN" pgm $sub --dsn "$unreachable_kw" -- true; keep
    expect 69 "$sub: unreachable server, URI DSN" pgm $sub --dsn "$unreachable_uri" -- true; keep
  else
    expect 69 "$sub: unreachable server, keyword DSN" pgm $sub --dsn "$unreachable_kw"; keep
    expect 69 "$sub: unreachable server, URI DSN" pgm $sub --dsn "$unreachable_uri"; keep
  fi
done
contains "$ERR" "cannot connect" "unreachable: the message says so"

# --- where the connection comes from -------------------------------------------
PGMUTEX_DSN="$unreachable_kw" expect 69 "PGMUTEX_DSN is used" pgm status; keep
PGMUTEX_DSN="$unreachable_kw" expect 0 "--dsn wins over PGMUTEX_DSN" pgm status --dsn "$kw_dsn"; keep
PGMUTEX_DSN="$kw_dsn" expect 0 "PGMUTEX_DSN with a password" pgm status; keep
expect 0 "no DSN at all: the PG* environment" pgm status
PGPORT=1 expect 69 "no DSN: PGPORT is honoured" pgm status; keep
PGHOST=$tcp PGUSER=$role PGPASSWORD=$wrong expect 77 "PGPASSWORD, wrong" pgm status; keep

# --- a multi-host DSN whose first host never answers: the second serves ----------
# The first host is a frozen proxy (TCP accepted, nothing answered). Each host
# has its own connect budget (the DSN's connect_timeout, else pgmutex's), so
# the first cannot use up the second's; before, every run failed (69).
start_fault_proxy
proxy_mode freeze
multi_kw="host=127.0.0.1,$tcp port=$proxy_port,$PGPORT dbname=$PGDATABASE user=$role password=$secret connect_timeout=3"
multi_uri="postgresql://$role:$secret@127.0.0.1:$proxy_port,$tcp:$PGPORT/$PGDATABASE"
expect 0 "run, first host frozen: the second serves (keyword DSN)" \
  pgm run --lock multi --dsn "$multi_kw" -- echo ran-on-the-second-host; keep
contains "$OUT" "ran-on-the-second-host" "the command ran (keyword DSN)"
expect 0 "run, first host frozen: the second serves (URI DSN, pgmutex's own budget)" \
  pgm run --lock multi --dsn "$multi_uri" -- echo ran-on-the-second-host; keep
contains "$OUT" "ran-on-the-second-host" "the command ran (URI DSN)"
expect 0 "status, first host frozen" pgm status --dsn "$multi_kw"; keep
mismatched="host=127.0.0.1,$tcp port=$proxy_port,$PGPORT,1 dbname=$PGDATABASE"
expect 64 "a multi-host DSN whose ports do not pair with its hosts: a usage error" \
  pgm run --lock multi --dsn "$mismatched" -- true; keep
contains "$ERR" "lists 3 ports for 2 host(s): give one port, or one per host" "the message names the rule"
proxy_mode pass

# --- run --wait waits for a server that cannot be reached yet -----------------
# The proxy resets every connection (a failover under way: no host answers),
# and passes again 1.5 s later. Without --wait, run exits 69 at once; with
# it, run tries again within its --timeout and runs the command once the
# server answers; with a --timeout that ends first, it exits 69, not 75.
proxy_dsn="host=127.0.0.1 port=$proxy_port dbname=$PGDATABASE user=$role password=$secret"
proxy_mode reset
expect 69 "run without --wait, server unreachable: exits 69 at once" \
  pgm run --lock unreachable --dsn "$proxy_dsn" -- echo should-not-run; keep
lacks "$OUT" "should-not-run" "the command did not run"
expect 69 "run --timeout 1, server unreachable throughout: 69 once the timeout is over" \
  pgm run --lock unreachable --dsn "$proxy_dsn" --timeout 1 -- echo should-not-run; keep
contains "$ERR" "cannot connect to Postgres" "the message says the server could not be reached"
( sleep 1.5; proxy_mode pass >/dev/null ) &
passes_again=$!
expect 0 "run --wait --timeout 30, server back after 1.5 s: the command runs" \
  pgm run --lock unreachable --dsn "$proxy_dsn" --timeout 30 -- echo ran-once-reachable; keep
contains "$OUT" "ran-once-reachable" "the command ran once the server answered"
wait "$passes_again"  # not a bare wait: that waits out the fault proxy's 120 s lifetime too

# --- never a password ------------------------------------------------------------
lacks "$all_output" "$secret" "no output showed the password"
[[ -s "$all_output" ]] && pass "there was output to check" || fail "no output was collected"

finish
