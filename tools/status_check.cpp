// pgmutex status --check NAME: one line and a monitoring plugin's exit code
// (status_check.hpp).
#include "status_check.hpp"

#include <cstdio>

#include "status_format.hpp"
#include "terminal_text.hpp"

namespace pgmutex::cli {
namespace {

std::string seconds_text(double seconds) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f s", seconds);
  return buffer;
}

}  // namespace

CheckResult check_lock(const std::string& lock, const std::optional<LockRow>& row, const ThresholdArgs& thresholds) {
  const std::string name = "lock '" + shown(lock) + "'";
  if (!row) return {check_code::ok, "PGMUTEX OK - " + name + " is free"};
  std::string held = name + " held by " + holder_text(*row) + ", fence " + std::to_string(row->fence) + ", heartbeat " +
                     seconds_text(row->seconds_since_heartbeat) + " ago";
  switch (state_of(*row, thresholds)) {
    case LockState::ok: return {check_code::ok, "PGMUTEX OK - " + held};
    case LockState::alert:
      return {check_code::warning,
              "PGMUTEX WARNING - " + held + ", past the alert threshold (" + seconds_text(thresholds.alert_s) + ")"};
    case LockState::expired:
      return {check_code::critical, "PGMUTEX CRITICAL - " + held + ", past its holder's own stale threshold (" +
                                        seconds_text(holders_stale_s(*row)) +
                                        "): the holder's lease is over and its row is left over"};
    case LockState::stale: break;
  }
  return {check_code::critical, "PGMUTEX CRITICAL - " + held + ", past the stale threshold (" +
                                    seconds_text(reclaim_after_s(*row, thresholds)) + "): the holder is presumed dead"};
}

CheckResult check_unknown(const std::string& why) { return {check_code::unknown, "PGMUTEX UNKNOWN - " + one_line(why)}; }

}  // namespace pgmutex::cli
