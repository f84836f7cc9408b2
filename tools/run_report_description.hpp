// The run's report, described once: the metrics `run --metrics-file`
// writes and the README's table of them come from here.
#pragma once

#include <array>

#include <boost/hana/adapt_struct.hpp>

#include "pgmutex/describe/field.hpp"
#include "run_report.hpp"

BOOST_HANA_ADAPT_STRUCT(pgmutex::cli::RunReport, lock, instance, start_time, end_time, duration, exit_code, lock_wait,
                        lock_outcome, fence, heartbeat_retries);

namespace pgmutex::describe {

template <>
struct Description<cli::RunReport> {
  static constexpr std::array<Field, 10> fields = {{
      {.name = "lock", .doc = "the lock's name", .label = "lock"},
      {.name = "instance", .doc = "this run's instance id", .label = "instance"},
      {.name = "start_time",
       .doc = "when pgmutex run started, in seconds since the epoch",
       .unit = "seconds",
       .metric = "pgmutex_run_start_time_seconds",
       .metric_type = "gauge"},
      {.name = "end_time",
       .doc = "when pgmutex run ended, in seconds since the epoch",
       .unit = "seconds",
       .metric = "pgmutex_run_end_time_seconds",
       .metric_type = "gauge"},
      {.name = "duration",
       .doc = "how long pgmutex run took, waiting for the lock included",
       .unit = "seconds",
       .metric = "pgmutex_run_duration_seconds",
       .metric_type = "gauge"},
      {.name = "exit_code",
       .doc = "pgmutex run's exit code: the command's, 75 taken, 70 lost, 128+N signal N, ...",
       .metric = "pgmutex_run_exit_code",
       .metric_type = "gauge"},
      {.name = "lock_wait",
       .doc = "how long the run waited for the lock",
       .unit = "seconds",
       .metric = "pgmutex_run_lock_wait_seconds",
       .metric_type = "gauge"},
      {.name = "lock_outcome",
       .doc = "what became of the lock: taken (by another holder), acquired, or lost while the command ran; 1 for "
              "what happened, 0 for the others (all 0 if no answer came)",
       .metric = "pgmutex_run_lock_outcome",
       .metric_type = "gauge",
       .label = "outcome"},
      {.name = "fence",
       .doc = "the fence of the run's grant (0: it got none)",
       .metric = "pgmutex_run_fence",
       .metric_type = "gauge"},
      {.name = "heartbeat_retries",
       .doc = "heartbeats that failed and were tried again while the command ran (a restart, a network hiccup): "
              "transient if the run did not lose the lock; --quiet does not print them",
       .metric = "pgmutex_run_heartbeat_retries",
       .metric_type = "gauge"},
  }};
};

}  // namespace pgmutex::describe
