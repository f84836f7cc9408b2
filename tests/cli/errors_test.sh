#!/usr/bin/env bash
# Each class of failure has its own exit code, against the real server: 64 a
# DSN value libpq refuses (never retried), 69 an unreachable server (and no
# "connection lost"), 77 a missing privilege or a failed login (with the GRANT
# to run), 78 a missing table, column or database (with the command to run).
# The fixes the messages give are run, and must work.
source "$(dirname "$0")/lib.sh" "$@"

: "${PGMUTEX_TEST_PASSWORD_ROLE:?run under scripts/with-postgres (it makes a password role)}"
: "${PGMUTEX_TEST_TCP_HOST:?run under scripts/with-postgres}"
tcp=$PGMUTEX_TEST_TCP_HOST
psql_admin() { psql -X -q -v ON_ERROR_STOP=1 -c "$1" >/dev/null; }

# --- 64: values libpq refuses, at once, whichever way they come ----------------
expect 64 "sslmode=bogus: usage error" pgm status --dsn "sslmode=bogus"
contains "$ERR" "sslmode='bogus' is not one of" "names the keyword, the value and the rule"
lacks "$ERR" "attempts" "not retried"
expect 64 "port=x: usage error" pgm run --lock x --dsn "port=x" -- true
contains "$ERR" "port='x'" "names the port"
expect 64 "port=70000: usage error" pgm schema --dsn "port=70000"
PGSSLMODE=bogus expect 64 "PGSSLMODE=bogus: usage error" pgm status
expect 64 "connect_timeout=soon: usage error" pgm status --dsn "connect_timeout=soon"
expect 64 "two ports for one host: usage error" pgm status --dsn "port=$PGPORT,$PGPORT"
contains "$ERR" "give one port, or one per host" "says how ports match hosts"
expect 0 "a port per host passes" pgm schema --dsn "host=$PGHOST,$PGHOST port=$PGPORT,$PGPORT"

# --- 69: unreachable, and no lost connection to speak of -----------------------
expect 69 "unreachable: 69" pgm status --dsn "host=127.0.0.1 port=1 connect_timeout=2"
contains "$ERR" "cannot connect to Postgres" "says it cannot connect"
lacks "$ERR" "connection lost" "no connection was lost"

# --- 78: the table, a column, the database ----------------------------------------
fresh="${TABLE}_none"
expect 78 "status on a missing table: 78" "$PGMUTEX" status --table "$fresh"
contains "$ERR" "pgmutex schema --table '$fresh'" "gives the schema command with the user's --table"
expect 78 "run on a missing table: 78" "$PGMUTEX" run --table "$fresh" --lock a -- true
dsn="host=$tcp port=$PGPORT dbname=$PGDATABASE user=$PGMUTEX_TEST_PASSWORD_ROLE password=$PGMUTEX_TEST_PASSWORD"
expect 78 "with --dsn: 78" "$PGMUTEX" status --table "$fresh" --dsn "$dsn"
contains "$ERR" "pgmutex schema --dsn 'host=$tcp port=$PGPORT dbname=$PGDATABASE user=$PGMUTEX_TEST_PASSWORD_ROLE password=********' --table '$fresh'" \
  "gives --dsn too, password masked"
lacks "$ERR" "$PGMUTEX_TEST_PASSWORD" "never the password"
PGMUTEX_DSN=$dsn expect 78 "DSN from PGMUTEX_DSN: 78" "$PGMUTEX" status --table "$fresh"
lacks "$ERR" "--dsn" "a DSN from the environment is not repeated as a flag"
expect 78 "missing database: 78" pgm status --dsn "dbname=pgmutex_no_such_db"
contains "$ERR" "does not exist" "says the database does not exist"
lacks "$ERR" "attempts" "not retried"

# A table made by the seed's package: run and status say what to run, and it works.
seed="${TABLE}_seed"
psql_admin "CREATE TABLE $seed (lock_name VARCHAR(64) NOT NULL, locked INT NOT NULL DEFAULT 1,
  instance_id VARCHAR(64) NOT NULL, last_heartbeat TIMESTAMPTZ NOT NULL, acquired_at TIMESTAMPTZ NOT NULL,
  CONSTRAINT uq_$seed UNIQUE (locked, lock_name), CONSTRAINT chk_locked CHECK (locked = 1))"
expect 78 "run on a seed-made table: 78" "$PGMUTEX" run --table "$seed" --lock a -- true
contains "$ERR" "pgmutex schema --table '$seed'" "run gives the upgrade command in full"
expect 78 "status on a seed-made table: 78" "$PGMUTEX" status --table "$seed"
fix=$(grep -o "pgmutex schema --table '[^']*'" "$ERR")
expect 0 "the command from the message upgrades the table" bash -c "${fix/pgmutex/\"\$0\"}" "$PGMUTEX"
expect 0 "run works after it" "$PGMUTEX" run --table "$seed" --lock a -- true

# --- 77: privileges and logins ----------------------------------------------------
expect 0 "schema" pgm schema
role="cli_nopriv_$$"
psql_admin "CREATE ROLE $role LOGIN"
expect 77 "status without SELECT: 77" pgm status --dsn "user=$role"
contains "$ERR" "GRANT SELECT, INSERT, UPDATE, DELETE ON $TABLE TO $role; GRANT USAGE ON SEQUENCE ${TABLE}_fence_seq TO $role" \
  "gives the GRANTs for this table and role"
expect 77 "run without privileges: 77" pgm run --lock g --dsn "user=$role" -- true
grants=$(grep -o "GRANT SELECT.*_fence_seq TO $role" "$ERR")
psql_admin "$grants"
expect 0 "the GRANTs from the message are enough to run" pgm run --lock g --dsn "user=$role" -- true
expect 0 "... and for status" pgm status --dsn "user=$role"
expect 77 "schema without CREATE: 77" "$PGMUTEX" schema --table "${TABLE}_new" --dsn "user=$role"
contains "$ERR" "GRANT CREATE ON SCHEMA public TO $role" "schema names the CREATE grant"
expect 77 "wrong password: 77" pgm status --dsn "host=$tcp port=$PGPORT dbname=$PGDATABASE user=$PGMUTEX_TEST_PASSWORD_ROLE password=wrong"
contains "$ERR" "authentication failed" "says authentication failed"
lacks "$ERR" "attempts" "a refused login is not retried"
expect 77 "no password given: 77" pgm status --dsn "host=$tcp port=$PGPORT dbname=$PGDATABASE user=$PGMUTEX_TEST_PASSWORD_ROLE"
contains "$ERR" "none was given" "says no password was given"
psql_admin "DROP OWNED BY $role; DROP ROLE $role"

finish
