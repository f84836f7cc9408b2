#!/usr/bin/env bash
# pgmutex elect (issue 18): a leader runs its command with PGMUTEX_TERM and
# PGMUTEX_VALUE and exits with its code; a second candidate waits in line and
# leads after the first with a higher term; with no command the leader holds
# until SIGTERM, then resigns (the election row vacated) and exits 0; a lost
# lease exits 70; a bad value is refused before any statement (64); status
# shows the leaders in text and JSON; --listen prints the present, then every
# change, until a signal.
source "$(dirname "$0")/lib.sh" "$@"

expect 0 "schema" pgm schema
election_rows() { psql -X -At -c "SELECT count(*) FROM ${TABLE}_election WHERE lock_name = '$1'"; }
announced() { psql -X -At -c "SELECT announced FROM ${TABLE}_election WHERE lock_name = '$1'"; }
queued() { psql -X -At -c "SELECT count(*) FROM ${TABLE}_queue WHERE lock_name = '$1'" 2>/dev/null; }
# wait_queued LOCK N: until N candidates wait in LOCK's line (fails the check after 20 s).
wait_queued() {
  local waited=0
  while [[ "$(queued "$1")" != "$2" ]]; do
    sleep 0.05
    waited=$((waited + 1))
    if ((waited > 400)); then
      fail "timed out waiting for $2 queued on $1 (have $(queued "$1"))"
      return 1
    fi
  done
}

# --- with a command: its environment and its exit code ------------------------
value='10.0.0.7:8080 ünï'
expect 7 "elect with a command exits with the command's code" \
  pgm elect --lock once --value "$value" -- sh -c "printf '%s\n%s\n%s\n' \"\$PGMUTEX_TERM\" \"\$PGMUTEX_VALUE\" \"\$PGMUTEX_FENCE\" >'$WORK/env'; exit 7"
term=$(sed -n 1p "$WORK/env")
[[ "$term" =~ ^[0-9]+$ && "$term" -gt 0 ]] && pass "PGMUTEX_TERM is a positive integer ($term)" || fail "PGMUTEX_TERM: '$term'"
equal "$(sed -n 2p "$WORK/env")" "$value" "PGMUTEX_VALUE is the value, byte for byte"
equal "$(sed -n 3p "$WORK/env")" "$term" "PGMUTEX_FENCE is the term"
expect 0 "status --json after the command" pgm status once --json
equal "$(jq -c '[(.locks | length), (.leaders | length), .leaders[0].term, .leaders[0].leading, .leaders[0].value]' "$OUT")" \
  "[0,1,$term,false,\"$value\"]" "after the command: resigned (not leading), the lock released, the term and value kept"
expect 0 "the command may follow without --, as run's" pgm elect --lock once --value v sh -c 'exit 0'

# --- a second candidate waits, then leads with a higher term -------------------
"$PGMUTEX" elect --table "$TABLE" --lock line --value first -- \
  sh -c "echo \$PGMUTEX_TERM >'$WORK/first'; while [ ! -e '$WORK/go' ]; do sleep 0.05; done" &
first=$!
background_pids+=("$first")
wait_for_file "$WORK/first"
"$PGMUTEX" elect --table "$TABLE" --lock line --value second -- \
  sh -c "printf '%s %s\n' \$PGMUTEX_TERM \"\$PGMUTEX_VALUE\" >'$WORK/second'" &
second=$!
background_pids+=("$second")
wait_queued line 1
sleep 0.3
[[ ! -e "$WORK/second" ]] && pass "the second candidate waits while the first leads" || fail "the second ran beside the first"
first_term=$(cat "$WORK/first")

# status shows the leader, in text and in JSON.
expect 0 "status while the first leads" pgm status line
matches "$OUT" "^LOCK +TERM +LEADING +INSTANCE +SINCE +VALUE$" "text: the leaders' header"
matches "$OUT" "^line +$first_term +yes +[^ ]+ +[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z +first$" "text: the leader's term, leading, value"
expect 0 "status --json while the first leads" pgm status --json
equal "$(jq -c '[.leaders[] | select(.lock == "line") | .term, .leading, .value]' "$OUT")" \
  "[$first_term,true,\"first\"]" "json: the leader's term, leading, value"
equal "$(jq -c '[.locks[] | select(.lock == "line") | .fence]' "$OUT")" "[$first_term]" "json: the lock's fence is the term"
equal "$(jq -c '.queue | length' "$OUT")" "1" "json: the second candidate is in line"

touch "$WORK/go"
wait_exit "$first" 30
equal "$EXIT" "0" "the first leader exits 0"
wait_exit "$second" 30
equal "$EXIT" "0" "the second leader exits 0"
read -r second_term second_value <"$WORK/second"
((second_term > first_term)) && pass "the second leads with a higher term ($second_term > $first_term)" ||
  fail "terms: first $first_term, second $second_term"
equal "$second_value" "second" "the second announces its own value"

# --- no command: lead until SIGTERM, then resign -------------------------------
# stdin at its end does not end the leadership (run's hold would let go).
"$PGMUTEX" elect --table "$TABLE" --lock hold --value held </dev/null >"$WORK/hold.out" 2>"$WORK/hold.err" &
holder=$!
background_pids+=("$holder")
wait_for_file "$WORK/hold.out"
matches "$WORK/hold.out" "^leading lock 'hold': term [0-9]+, value 'held'$" "one line: it leads, the term, the value"
hold_term=$(sed -E 's/.*term ([0-9]+),.*/\1/' "$WORK/hold.out")
sleep 0.5
kill -0 "$holder" 2>/dev/null && pass "it still leads with stdin at its end" || fail "it ended without a signal"
expect 0 "status --json while it leads" pgm status hold --json
equal "$(jq -c '[.leaders[0].term, .leaders[0].leading, .leaders[0].value]' "$OUT")" "[$hold_term,true,\"held\"]" \
  "json: it leads"
equal "$(announced hold)" "t" "the election row is announced"
kill -TERM "$holder"
wait_exit "$holder" 10
equal "$EXIT" "0" "SIGTERM: it resigns and exits 0"
equal "$(announced hold)" "f" "the election row is vacated"
expect 0 "status --json after SIGTERM" pgm status hold --json
equal "$(jq -c '[(.locks | length), .leaders[0].leading]' "$OUT")" "[0,false]" "json: the lock released, nobody leads"

# --- a lost lease: 70 ------------------------------------------------------------
"$PGMUTEX" elect --table "$TABLE" --lock doomed --value v --heartbeat-interval 0.2 --alert-threshold 1 \
  --stale-threshold 3 --grace 0.5 >"$WORK/doomed.out" 2>"$WORK/doomed.err" &
doomed=$!
background_pids+=("$doomed")
wait_for_file "$WORK/doomed.out"
expect 0 "release --force the leader's lock" pgm release --force doomed
wait_exit "$doomed" 10
equal "$EXIT" "70" "the leadership lost: exit 70"
contains "$WORK/doomed.err" "the leadership of lock 'doomed' (term" "it says the leadership was lost"
contains "$WORK/doomed.err" "was lost while it was held" "... while it was held"

# --- a campaign that times out: 75, naming the leader ----------------------------
"$PGMUTEX" elect --table "$TABLE" --lock busy --value busy-leader >"$WORK/busy.out" &
busy=$!
background_pids+=("$busy")
wait_for_file "$WORK/busy.out"
expect 75 "a campaign past --timeout: 75" pgm elect --lock busy --value late -w 0.5 -- true
contains "$ERR" "not leading after waiting 0.5 s" "it says it gave up"
contains "$ERR" "value 'busy-leader'" "and names the leader's value"
# A candidate interrupted while it waits in line: 128+15, and no place left behind.
"$PGMUTEX" elect --table "$TABLE" --lock busy --value interrupted -- true 2>"$WORK/interrupted.err" &
waiting=$!
background_pids+=("$waiting")
wait_queued busy 1
kill -TERM "$waiting"
wait_exit "$waiting" 10
equal "$EXIT" "143" "SIGTERM while campaigning: 143"
contains "$WORK/interrupted.err" "interrupted by SIGTERM while campaigning for lock 'busy'" "it says so"
equal "$(queued busy)" "0" "... and leaves no place in line"
kill -TERM "$busy"
wait_exit "$busy" 10
equal "$EXIT" "0" "the busy leader resigns on SIGTERM"

# --- --listen: the present, then every change, until SIGTERM ---------------------
"$PGMUTEX" elect --table "$TABLE" --lock watched --listen --json >"$WORK/listen.out" 2>"$WORK/listen.err" &
listener=$!
background_pids+=("$listener")
wait_for_file "$WORK/listen.out"
equal "$(jq -c '[.lock, .event, .value, .instance, .gap]' <(sed -n 1p "$WORK/listen.out"))" \
  '["watched","current",null,null,false]' "json: first the present: nobody leads (value and instance null)"
expect 0 "a leader comes and goes" pgm elect --lock watched --value 10.0.0.9:80 --instance-id web-9 -- true
# lines_in FILE N: until FILE has N lines (fails the check after 10 s).
lines_in() {
  local waited=0
  while (($(wc -l <"$1") < $2)); do
    sleep 0.05
    waited=$((waited + 1))
    ((waited > 200)) && { fail "timed out waiting for $2 lines in $1"; return 1; }
  done
  return 0
}
lines_in "$WORK/listen.out" 3
equal "$(jq -c '[.event, .value, .instance, (.term | type), .gap]' <(sed -n 2p "$WORK/listen.out"))" \
  '["elected","10.0.0.9:80","web-9","number",false]' "json: elected, with the value, the instance, an integer term"
equal "$(jq -c '[.event, .value, .instance, .gap]' <(sed -n 3p "$WORK/listen.out"))" \
  '["vacated",null,null,false]' "json: vacated when the command ended, nobody leads"
listened_term=$(jq '.term' <(sed -n 2p "$WORK/listen.out"))
equal "$(jq '.term' <(sed -n 3p "$WORK/listen.out"))" "$listened_term" "the vacated term is the elected one"
kill -TERM "$listener"
wait_exit "$listener" 10
equal "$EXIT" "0" "SIGTERM ends listening: exit 0"
# The text form.
"$PGMUTEX" elect --table "$TABLE" --lock watched --listen >"$WORK/listen.txt" 2>&1 &
listener=$!
background_pids+=("$listener")
wait_for_file "$WORK/listen.txt"
matches "$WORK/listen.txt" "^term $listened_term: nobody leads \(now\)$" "text: who leads now"
kill -TERM "$listener"
wait_exit "$listener" 10
equal "$EXIT" "0" "SIGTERM ends the text form too"
expect 64 "--listen takes no value" pgm elect --lock watched --listen --value v
contains "$ERR" "--listen follows the election: it takes no --value and no command" "says why"
expect 64 "--json without --listen" pgm elect --lock watched --value v --json -- true
expect 64 "no --value and no --listen" pgm elect --lock watched -- true
contains "$ERR" "--value is required to campaign" "says what is missing"

# --- a leader SIGKILLed: the successor leads only once its row is stale ----------
"$PGMUTEX" elect --table "$TABLE" --lock killed --listen --json >"$WORK/killed.listen" 2>&1 &
killed_listener=$!
background_pids+=("$killed_listener")
wait_for_file "$WORK/killed.listen"
"$PGMUTEX" elect --table "$TABLE" --lock killed --value doomed --heartbeat-interval 0.2 --alert-threshold 1 \
  --stale-threshold 3 --grace 0.5 -- sh -c "echo \$PGMUTEX_TERM >'$WORK/killed.term'; exec sleep 60" \
  >/dev/null 2>"$WORK/killed.err" &
victim=$!
background_pids+=("$victim")
wait_for_file "$WORK/killed.term"
kill -KILL "$victim"
killed_at=$(now_ms)
expect 0 "a candidate after the SIGKILL leads once the row is stale" \
  pgm elect --lock killed --value successor -w 20 --stale-threshold 3 --alert-threshold 1 --heartbeat-interval 0.2 \
  -- sh -c "echo \$PGMUTEX_TERM >'$WORK/successor.term'"
waited=$(($(now_ms) - killed_at))
((waited >= 2500)) && pass "the successor waited for the stale row (${waited} ms after the SIGKILL)" ||
  fail "the successor led ${waited} ms after the SIGKILL, before the 3 s threshold"
(($(cat "$WORK/successor.term") > $(cat "$WORK/killed.term"))) && pass "with a higher term" || fail "terms did not rise"
for _ in $(seq 200); do [[ "$(tail -n 1 "$WORK/killed.listen" | jq -r .event)" == vacated ]] && break; sleep 0.05; done
equal "$(jq -c -s '[.[] | select(.event != "expired") | [.event, .term]]' "$WORK/killed.listen")" \
  "[[\"current\",0],[\"elected\",$(cat "$WORK/killed.term")],[\"elected\",$(cat "$WORK/successor.term")],[\"vacated\",$(cat "$WORK/successor.term")]]" \
  "the listener: nobody, the killed leader, (perhaps its expiry,) the successor, its resignation, in order"
equal "$(jq -c 'select(.gap)' "$WORK/killed.listen")" "" "no gap while connected"
kill -TERM "$killed_listener"
wait_exit "$killed_listener" 10

# --- a value the library refuses: 64, before any statement ------------------------
big=$(head -c 7169 /dev/zero | tr '\0' a)
expect 64 "a value over 7168 bytes: 64" pgm elect --lock big --value "$big" -- true
contains "$ERR" "--value: the value for election 'big' is 7169 bytes; at most 7168" "names the input and the bound"
expect 64 "a value that is not UTF-8: 64" pgm elect --lock big --value "$(printf 'a\xffb')" -- true
contains "$ERR" "--value: the value for election 'big' must be valid UTF-8" "names the input and the rule"
expect 0 "exactly 7168 bytes is accepted" pgm elect --lock big --value "${big:1}" -- true
expect 0 "status --json shows the long value" pgm status big --json
equal "$(jq -r '.leaders[0].value | length' "$OUT")" "7168" "json: the value whole"
# Refused before any statement: nobody queued or leads, on a table that does not exist.
expect 64 "refused before connecting: a table that does not exist is never read" \
  "$PGMUTEX" elect --table "no_such_$$" --lock big --value "$big" -- true
lacks "$ERR" "does not exist" "no statement reached the server"

# --- status on a table made before elections -------------------------------------
psql -X -q -c "DROP TABLE ${TABLE}_election"
expect 0 "status without an election table still works" pgm status --json
equal "$(jq -c '.leaders' "$OUT")" "[]" "json: no leaders"

finish
