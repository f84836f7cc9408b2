// PrometheusMetrics' numbers, described once: the metric names, types and
// HELP texts that render() writes, and the README's table of them.
#pragma once

#include <array>

#include <boost/hana/adapt_struct.hpp>

#include "pgmutex/describe/field.hpp"
#include "pgmutex/metrics/prometheus.hpp"

BOOST_HANA_ADAPT_STRUCT(pgmutex::LockMetrics, acquired, released, contended, stale_reclaimed, lost, alerts,
                        heartbeat_failures, acquire_latency, heartbeat_latency);

namespace pgmutex::describe {

template <>
struct Description<LockMetrics> {
  static constexpr std::array<Field, 9> fields = {{
      {.name = "acquired", .doc = "grants this process won", .metric = "pgmutex_acquired_total", .metric_type = "counter"},
      {.name = "released", .doc = "grants this process released", .metric = "pgmutex_released_total", .metric_type = "counter"},
      {.name = "contended",
       .doc = "acquire attempts that found the lock held by another instance",
       .metric = "pgmutex_contended_total",
       .metric_type = "counter"},
      {.name = "stale_reclaimed",
       .doc = "grants won by taking over a stale holder's row",
       .metric = "pgmutex_stale_reclaimed_total",
       .metric_type = "counter"},
      {.name = "lost",
       .doc = "grants lost while held (lease ran out, or the row was gone or another's)",
       .metric = "pgmutex_lost_total",
       .metric_type = "counter"},
      {.name = "alerts",
       .doc = "times a holder was seen silent past the alert threshold",
       .metric = "pgmutex_alerts_total",
       .metric_type = "counter"},
      {.name = "heartbeat_failures",
       .doc = "heartbeats that failed and were retried",
       .metric = "pgmutex_heartbeat_failures_total",
       .metric_type = "counter"},
      {.name = "acquire_latency",
       .doc = "round trip of the acquire statement that won a grant",
       .unit = "seconds",
       .metric = "pgmutex_acquire_latency_seconds",
       .metric_type = "histogram"},
      {.name = "heartbeat_latency",
       .doc = "round trip of each successful heartbeat",
       .unit = "seconds",
       .metric = "pgmutex_heartbeat_latency_seconds",
       .metric_type = "histogram"},
  }};
};

}  // namespace pgmutex::describe
