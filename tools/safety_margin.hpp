// pgmutex run's safety margin: how long before --stale-threshold runs out the
// holder stops trusting its lease. After a lost lease the command's group gets
// SIGTERM, and SIGKILL after --grace, so the margin must cover the grace on
// top of what the library requires (one heartbeat attempt, plus one interval
// since PostgresBackend commits heartbeats asynchronously): otherwise the
// command may still run when another instance may take the lock over.
#pragma once

#include <chrono>
#include <string>

#include "pgmutex/options.hpp"

namespace pgmutex::cli {

// PostgresBackend's default, which pgmutex run keeps: heartbeats commit
// asynchronously, so a margin must cover one heartbeat_interval more.
inline constexpr BackendTraits run_backend_traits{true};

struct RunMargin {
  Options options;        // safety_margin and heartbeat_timeout set where the thresholds allow
  std::string shortfall;  // empty, or why the margin cannot cover --grace and which flag to change
};

// The margin covers grace + one heartbeat attempt + one heartbeat interval;
// the attempt's timeout is half of grace + interval (a third of the margin),
// 1..10 s. Where stale_threshold leaves no room for that, the library's
// defaults stay (or the least margin the rules accept, if their cap breaks
// a rule) and `shortfall` says so with the numbers.
[[nodiscard]] RunMargin plan_margin(Options options, std::chrono::nanoseconds grace);

// How long before the lease deadline the guard process sends SIGTERM when no
// renewal came (pgmutex stopped): --grace, so that the command is gone by
// the deadline, where the margin covers it and the lease leaves room;
// otherwise less (at least 0): what the margin leaves beyond one heartbeat
// attempt and one interval, and what the lease leaves beyond two intervals
// and an attempt, so that a healthy holder's renewals always come in time.
[[nodiscard]] std::chrono::nanoseconds guard_lead(const ValidOptions& options, std::chrono::nanoseconds grace);

}  // namespace pgmutex::cli
