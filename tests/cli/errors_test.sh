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
# libpq quotes the string it could not read: the user's, never one with our timeouts appended.
expect 64 "a URI libpq cannot read: usage error" pgm schema --dsn "postgresql://[::1"
contains "$ERR" '"postgresql://[::1"' "libpq's message quotes the DSN as written"
lacks "$ERR" "connect_timeout" "and no parameter the user did not write"
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
# status only reads: a monitoring role needs SELECT alone, and is told so.
contains "$ERR" "run: GRANT SELECT ON $TABLE, ${TABLE}_queue TO $role (holding locks needs INSERT, UPDATE, DELETE too" \
  "status names the one GRANT a reader needs"
psql_admin "$(grep -o "GRANT SELECT ON $TABLE, ${TABLE}_queue TO $role" "$ERR")"
expect 0 "that GRANT alone is enough for status" pgm status --dsn "user=$role"
lacks "$ERR" "not shown" "... with the queues shown"
# Without SELECT on the queue (a reader granted before the queue existed), status still shows the locks.
psql_admin "REVOKE SELECT ON ${TABLE}_queue FROM $role"
expect 0 "status with SELECT on the lock table alone: 0" pgm status --dsn "user=$role"
contains "$ERR" "the queues are not shown: permission denied" "... and says the queues are not shown"
contains "$ERR" "GRANT SELECT ON $TABLE, ${TABLE}_queue TO $role" "... with the GRANT that shows them"
expect 77 "run without privileges: 77" pgm run --lock g --dsn "user=$role" -- true
contains "$ERR" "GRANT SELECT, INSERT, UPDATE, DELETE ON $TABLE, ${TABLE}_queue TO $role; GRANT USAGE ON SEQUENCE ${TABLE}_fence_seq TO $role" \
  "run gives the GRANTs a holder needs, for this table and role"
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

# --- table names, as psql reads them ------------------------------------------------
psql_value() { psql -X -A -t -v ON_ERROR_STOP=1 -c "$1"; }
# 63 bytes, the longest identifier: its derived names fit, with a hash.
long63="t$$_$(printf 'n%.0s' {1..100})"
long63=${long63:0:63}
expect 0 "schema with a 63-byte table name" "$PGMUTEX" schema --table "$long63"
expect 0 "run on it" "$PGMUTEX" run --table "$long63" --lock a -- true
# A 58-byte table made by an earlier pgmutex: Postgres had cut its sequence's
# name short. schema refuses to start a second sequence (fences would restart
# at 1) and names the one to rename; renamed, fences go on from where they were.
old58="o$$_$(printf 'o%.0s' {1..60})"
old58=${old58:0:58}
cut_seq="${old58}_fence_seq"
cut_seq=${cut_seq:0:63}
psql_admin "CREATE SEQUENCE \"$cut_seq\" START 500; CREATE TABLE \"$old58\" (lock_name VARCHAR(64) NOT NULL,
  locked INT NOT NULL DEFAULT 1, instance_id VARCHAR(64) NOT NULL, last_heartbeat TIMESTAMPTZ NOT NULL,
  acquired_at TIMESTAMPTZ NOT NULL, fence BIGINT NOT NULL DEFAULT nextval('\"$cut_seq\"'),
  CONSTRAINT \"uq_o$$\" UNIQUE (locked, lock_name))"
expect 76 "schema on a table whose sequence an older pgmutex let Postgres cut short: 76" "$PGMUTEX" schema --table "$old58"
contains "$ERR" "has fences but no sequence" "says the derived sequence is missing"
contains "$ERR" "$cut_seq" "names the sequence its fences come from"
derived=$(grep -o 'rename that sequence to "[^"]*"' "$ERR" | sed 's/.*to "//; s/"$//')
psql_admin "ALTER SEQUENCE \"$cut_seq\" RENAME TO \"$derived\""
expect 0 "schema after the rename the message names" "$PGMUTEX" schema --table "$old58"
"$PGMUTEX" run --table "$old58" --lock a -- sh -c 'echo "$PGMUTEX_FENCE" >"$0"' "$WORK/old58.fence" >/dev/null 2>&1
(( $(cat "$WORK/old58.fence") >= 500 )) && pass "fences go on from the old sequence ($(cat "$WORK/old58.fence"))" ||
  fail "fence after the rename: $(cat "$WORK/old58.fence")"
# Two 62-byte names with a common 61-byte prefix: each its own constraint and sequence.
prefix="${long63:0:61}"
expect 0 "schema: a 62-byte name" "$PGMUTEX" schema --table "${prefix}_a"
expect 0 "schema: another with the same 61 first bytes" "$PGMUTEX" schema --table "${prefix}_b"
equal "$(psql_value "SELECT count(DISTINCT conname) FROM pg_constraint WHERE conrelid IN ('${prefix}_a'::regclass, '${prefix}_b'::regclass) AND contype = 'u'")" \
  "2" "two long names, two unique constraints"
# 58 bytes: the GRANT hint names the sequence that exists.
long58=${long63:0:58}
expect 0 "schema with a 58-byte table name" "$PGMUTEX" schema --table "$long58"
role="cli_long_$$"
psql_admin "CREATE ROLE $role LOGIN"
expect 77 "a role without privileges on the 58-byte table: 77" "$PGMUTEX" run --table "$long58" --dsn "user=$role" --lock a -- true
sequence=$(grep -o "GRANT USAGE ON SEQUENCE [^ ]* TO" "$ERR" | awk '{print $5}')
[[ -n "$sequence" && "$(psql_value "SELECT to_regclass('$sequence') IS NOT NULL")" == "t" ]] &&
  pass "the hint names a sequence that exists ($sequence)" || fail "hint sequence '$sequence' does not exist: $(cat "$ERR")"
psql_admin "$(grep -o "GRANT SELECT.* TO $role" "$ERR")"
expect 0 "the hint's GRANTs are enough" "$PGMUTEX" run --table "$long58" --dsn "user=$role" --lock a -- true
psql_admin "DROP OWNED BY $role; DROP ROLE $role"
# A lock table a DBA made (with the seed's DDL) under a name with a dash, used quoted as in psql.
psql_admin "CREATE TABLE \"lock-table-$$\" (lock_name VARCHAR(64) NOT NULL, locked INT NOT NULL DEFAULT 1,
  instance_id VARCHAR(64) NOT NULL, last_heartbeat TIMESTAMPTZ NOT NULL, acquired_at TIMESTAMPTZ NOT NULL,
  CONSTRAINT \"uq_lock-table-$$\" UNIQUE (locked, lock_name), CONSTRAINT chk_locked CHECK (locked = 1))"
expect 0 "schema on an existing table named with a dash" "$PGMUTEX" schema --table "\"lock-table-$$\""
expect 0 "run on it" "$PGMUTEX" run --table "\"lock-table-$$\"" --lock a -- true
# Unquoted names fold to lower case, as in psql: one table, one lock.
psql_admin "CREATE SCHEMA cli_fold_$$"
expect 0 "schema: Cli_Fold.Jobs" "$PGMUTEX" schema --table "Cli_Fold_$$.Jobs"
"$PGMUTEX" run --table "Cli_Fold_$$.Jobs" --lock folded -- sh -c 'echo x >"$0"; sleep 30' "$WORK/folded" >/dev/null 2>&1 &
background_pids+=("$!")
wait_for_file "$WORK/folded"
expect 75 "cli_fold.jobs is the same table: the lock is taken" "$PGMUTEX" run --table "cli_fold_$$.jobs" --lock folded -- true
equal "$(psql_value "SELECT count(*) FROM cli_fold_$$.jobs")" "1" "the row is in cli_fold.jobs"
expect 64 "a quoted name left open: usage error" "$PGMUTEX" status --table '"open'
contains "$ERR" "unterminated quoted identifier" "says what is wrong"

# --- hints that name the real cause ---------------------------------------------------
# A schema that does not exist: 78, with the CREATE SCHEMA that fixes it.
expect 78 "schema in a schema that does not exist: 78" "$PGMUTEX" schema --table "No_Such_$$.Jobs"
contains "$ERR" "CREATE SCHEMA no_such_$$, then: pgmutex schema --table 'No_Such_$$.Jobs'" "names CREATE SCHEMA, then the command"
# A missing table: the command's advice, not the library's as well.
expect 78 "status on a missing table: 78" "$PGMUTEX" status --table "missing_$$"
lacks "$ERR" "create_schema()" "the command's message gives no library advice"
contains "$ERR" "pgmutex schema --table 'missing_$$'" "... but the command to run"
# A primary whose role makes every transaction read-only is not a standby.
role="cli_ro_$$"
psql_admin "CREATE ROLE $role LOGIN; ALTER ROLE $role SET default_transaction_read_only = on;
  GRANT SELECT, INSERT, UPDATE, DELETE ON $TABLE, ${TABLE}_queue TO $role; GRANT USAGE ON SEQUENCE ${TABLE}_fence_seq TO $role"
expect 76 "a read-only role: 76" pgm run --lock ro --dsn "user=$role" -- true
contains "$ERR" "default_transaction_read_only is on for role $role" "says the role's setting, not a standby"
lacks "$ERR" "standby" "never calls a primary a standby"
psql_admin "DROP OWNED BY $role; DROP ROLE $role"

finish
