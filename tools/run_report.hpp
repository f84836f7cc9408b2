// pgmutex run --metrics-file PATH: what one run did, for node_exporter's
// textfile collector. Described once in run_report_description.hpp; the
// metrics and the README's table of them come from that description.
#pragma once

#include <array>
#include <chrono>
#include <mutex>
#include <string>
#include <string_view>

#include "pgmutex/backend.hpp"

namespace pgmutex::cli {

enum class LockOutcome { none, taken, acquired, lost };  // none: never got an answer (usage, unreachable, interrupted)
[[nodiscard]] std::string_view to_string(LockOutcome outcome) noexcept;
// The values a metric shows (none is all of them at 0).
constexpr std::array<LockOutcome, 3> all_values(LockOutcome) {
  return {LockOutcome::taken, LockOutcome::acquired, LockOutcome::lost};
}

struct RunReport {
  std::string lock;
  std::string instance;
  double start_time = 0;  // seconds since the epoch
  double end_time = 0;
  double duration = 0;
  double exit_code = 0;
  double lock_wait = 0;
  LockOutcome lock_outcome = LockOutcome::none;
  double fence = 0;  // 0: no grant
  double heartbeat_retries = 0;  // heartbeats that failed and were tried again
};

// The text exposition of one run's report.
[[nodiscard]] std::string format_run_report(const RunReport& report);

// Keeps the run's report and writes it once, when the run ends, whichever
// way it ends (any thread may call write(); the first call wins).
class RunMetricsFile {
 public:
  // An empty path: nothing is recorded or written.
  RunMetricsFile(std::string path, std::string lock, std::string instance);

  void set_instance(std::string_view instance);
  void wait_started();
  void wait_ended(LockOutcome outcome, Fence fence = 0);
  void lost();
  // A heartbeat failed and is tried again: counted. Returns nothing to print.
  void heartbeat_failed();
  // A heartbeat succeeded: how many failed in a row before it (0: none).
  int heartbeat_succeeded();

  // Writes the report with this exit code: a temporary file in the same
  // folder, renamed over PATH, so a scrape never reads half of it. A failure
  // is a warning on stderr; it never changes the exit code.
  void write(int exit_code) noexcept;

 private:
  std::string path_;
  std::mutex mutex_;
  RunReport report_;
  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::time_point wait_started_;
  bool written_ = false;
  int failed_in_a_row_ = 0;
};

}  // namespace pgmutex::cli
