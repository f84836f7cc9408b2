// pgmutex status --check NAME: one line and an exit code as monitoring plugins
// (Nagios, Icinga, Sensu) read them: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.
#pragma once

#include <optional>
#include <string>

#include "arguments.hpp"
#include "pgmutex/backend.hpp"

namespace pgmutex::cli {

namespace check_code {
inline constexpr int ok = 0;        // free, or held with fresh heartbeats
inline constexpr int warning = 1;   // held, past the alert threshold
inline constexpr int critical = 2;  // held, past the stale threshold: reclaimable
inline constexpr int unknown = 3;   // the lock could not be read
}  // namespace check_code

struct CheckResult {
  int code;
  std::string line;  // "PGMUTEX OK - lock 'x' held by ..., fence 7, heartbeat 1.2 s ago"
};

// The verdict on `lock`, held as `row` (nullopt: free).
[[nodiscard]] CheckResult check_lock(const std::string& lock, const std::optional<LockRow>& row,
                                     const ThresholdArgs& thresholds);

// The verdict when the lock could not be read: `why` is the error's message.
[[nodiscard]] CheckResult check_unknown(const std::string& why);

}  // namespace pgmutex::cli
