// Options, described once: each member's doc, unit, flag and rule. The
// library's error messages, the command's flags and the README's option
// table are made from this (tools/describe_tables prints the table).
#pragma once

#include <array>

#include <boost/hana/adapt_struct.hpp>

#include "pgmutex/describe/field.hpp"
#include "pgmutex/options.hpp"

// Options and ValidOptions are one template (options.hpp): one member list.
#define PGMUTEX_OPTIONS_MEMBERS                                                                               \
  lock_name, instance_id, table, heartbeat_interval, alert_threshold, stale_threshold, poll_interval, safety_margin, \
      heartbeat_timeout, handoff_deadline
BOOST_HANA_ADAPT_STRUCT(pgmutex::Options, PGMUTEX_OPTIONS_MEMBERS);
BOOST_HANA_ADAPT_STRUCT(pgmutex::ValidOptions, PGMUTEX_OPTIONS_MEMBERS);
#undef PGMUTEX_OPTIONS_MEMBERS

namespace pgmutex::describe {

template <template <class> class Defaulted>
struct Description<BasicOptions<Defaulted>> {
  static constexpr std::array<Field, 10> fields = {{
      {.name = "lock_name",
       .doc = "the lock's name, 1..64 characters",
       .flag = "--lock",
       .default_text = "(required)",
       .rule = "1..64 characters, counted as `VARCHAR(64)` counts them (code points of valid UTF-8)"},
      {.name = "instance_id",
       .doc = "this holder's id, 1..64 characters, unique per process, as status shows it",
       .flag = "--instance-id",
       .default_text = "`<hostname>-<8 random hex digits>`",
       .rule = "1..64 characters; unique per process"},
      {.name = "table",
       .doc = "the lock table",
       .flag = "--table",
       .rule = "`[A-Za-z_][A-Za-z0-9_]*` (at most 63 bytes), optionally `schema.table`; always quoted in SQL"},
      {.name = "heartbeat_interval",
       .doc = "seconds between heartbeats while the lock is held",
       .unit = "seconds",
       .flag = "--heartbeat-interval",
       .rule = "> 0 and < `alert_threshold`"},
      {.name = "alert_threshold",
       .doc = "seconds without a heartbeat before a holder is 'alert': slow, or dead?",
       .unit = "seconds",
       .flag = "--alert-threshold",
       .rule = "< `stale_threshold`"},
      {.name = "stale_threshold",
       .doc = "seconds without a heartbeat before a lock is 'stale' and any instance may reclaim it",
       .unit = "seconds",
       .flag = "--stale-threshold"},
      {.name = "poll_interval",
       .doc = "time between tries of a blocking acquire (Postgres also wakes waiters by NOTIFY)",
       .unit = "seconds",
       .rule = "> 0"},
      {.name = "safety_margin",
       .doc = "the holder gives its lease up this long before stale_threshold runs out",
       .unit = "seconds",
       .flag = "the safety margin",
       .default_text = "max(stale/10, 1.5 × heartbeat), at most (stale − heartbeat)/2",
       .rule = "> 0; `stale_threshold − safety_margin` > `heartbeat_interval`; ≥ `heartbeat_timeout`, plus "
               "`heartbeat_interval` where heartbeats commit asynchronously (`PostgresBackend` by default)"},
      {.name = "heartbeat_timeout",
       .doc = "the longest one heartbeat or release may take, reconnects included (client deadline, "
              "`lock_timeout`, `statement_timeout`)",
       .unit = "seconds",
       .flag = "one heartbeat attempt's timeout",
       .default_text = "min(safety_margin/3, 10 s)",
       .rule = "> 0"},
      {.name = "handoff_deadline",
       .doc = "how long a queued waiter that a release offered the lock has to take it, before its turn passes "
              "to the next live waiter",
       .unit = "seconds",
       .flag = "--handoff-deadline",
       .default_text = "min(2 s, stale_threshold − safety_margin)",
       .rule = "> 0 and ≤ `stale_threshold − safety_margin`"},
  }};
};

}  // namespace pgmutex::describe
