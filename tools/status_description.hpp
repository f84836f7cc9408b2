// The status row, described once: `status`'s text columns, its JSON keys and
// its Prometheus metrics, and the README's table of them, come from here.
#pragma once

#include <array>

#include <boost/hana/adapt_struct.hpp>

#include "pgmutex/describe/field.hpp"
#include "status_format.hpp"

BOOST_HANA_ADAPT_STRUCT(pgmutex::cli::LockStatus, lock, instance, fence, acquired_at, seconds_since_heartbeat, state,
                        queue_length, host, pid, command);
BOOST_HANA_ADAPT_STRUCT(pgmutex::cli::WaiterStatus, lock, position, instance, seconds_waiting, state, host, pid);
BOOST_HANA_ADAPT_STRUCT(pgmutex::cli::LeaderStatus, lock, term, leading, instance, since, value);

namespace pgmutex::describe {

template <>
struct Description<cli::LockStatus> {
  static constexpr std::array<Field, 10> fields = {{
      {.name = "lock", .doc = "the lock's name", .label = "lock"},
      {.name = "instance", .doc = "the holder's instance id", .label = "instance"},
      {.name = "fence",
       .doc = "the holder's fencing token: strictly increasing per lock",
       .metric = "pgmutex_lock_fence",
       .metric_type = "gauge"},
      {.name = "acquired_at", .doc = "when the holder acquired the lock (UTC, ISO 8601, the server's clock)"},
      {.name = "seconds_since_heartbeat",
       .doc = "seconds since the holder's last heartbeat, by the server's clock",
       .unit = "seconds",
       .column = "HEARTBEAT_AGE",
       .metric = "pgmutex_lock_heartbeat_age_seconds",
       .metric_type = "gauge"},
      {.name = "state",
       .doc = "ok; alert (no heartbeat for the alert threshold); expired (none for the stale threshold the holder "
              "stored: its lease is over, but the stale threshold given does not reclaim it yet); or stale (none for "
              "the larger of the two: reclaimable, by the rule an acquire uses); as a metric, 1 for the lock's state "
              "and 0 for the others",
       .metric = "pgmutex_lock_state",
       .metric_type = "gauge",
       .label = "state"},
      {.name = "queue_length",
       .doc = "waiters in the lock's queue (each listed under `queue`)",
       .column = "QUEUE",
       .metric = "pgmutex_lock_queue_length",
       .metric_type = "gauge"},
      {.name = "host", .doc = "the holder's host, as its grant recorded it (null: not recorded)"},
      {.name = "pid", .doc = "the holder's pid (null: not recorded)"},
      {.name = "command", .doc = "the holder's command, its first 200 bytes (null: not recorded)"},
  }};
  // Not a member: a row's presence.
  static constexpr Field held = {.name = "held",
                                 .doc = "1 while the lock is held, 0 for a lock asked for by name that nobody holds",
                                 .metric = "pgmutex_lock_held",
                                 .metric_type = "gauge"};
};

template <>
struct Description<cli::WaiterStatus> {
  static constexpr std::array<Field, 7> fields = {{
      {.name = "lock", .doc = "the lock it waits for", .label = "lock"},
      {.name = "position", .doc = "its place in line: 1 is next", .label = "position"},
      {.name = "instance", .doc = "the waiter's instance id", .label = "instance"},
      {.name = "seconds_waiting",
       .doc = "seconds since it joined the queue, by the server's clock",
       .unit = "seconds",
       .column = "WAITED",
       .metric = "pgmutex_queue_waiter_seconds",
       .metric_type = "gauge"},
      {.name = "state",
       .doc = "waiting; offered (a release handed it the lock and it has not confirmed yet); or dead (its connection "
              "closed: the next release skips it); as a metric, 1 for its state and 0 for the others",
       .metric = "pgmutex_queue_waiter_state",
       .metric_type = "gauge",
       .label = "state"},
      {.name = "host", .doc = "the waiter's host (null: not recorded)"},
      {.name = "pid", .doc = "the waiter's pid (null: not recorded)"},
  }};
};

template <>
struct Description<cli::LeaderStatus> {
  static constexpr std::array<Field, 6> fields = {{
      {.name = "lock", .doc = "the election's lock"},
      {.name = "term", .doc = "the last term announced: its leader's grant's fence, strictly increasing per lock"},
      {.name = "leading",
       .doc = "true while that term's leader leads: announced, not resigned, its lock row live under the same fence"},
      {.name = "instance", .doc = "that term's leader's instance id"},
      {.name = "since", .doc = "when the term began (UTC, ISO 8601, the server's clock)"},
      {.name = "value", .doc = "what the leader announced last (`pgmutex elect --value`)"},
  }};
};

}  // namespace pgmutex::describe
