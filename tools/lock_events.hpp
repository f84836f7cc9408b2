// The Metrics policy of the command: the library's hooks, told on stderr as
// --quiet and --verbose allow, counted in the run's report, and the lease
// deadlines, handed to the guard process that enforces them too
// (lease_watch.hpp).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>

#include "lease_watch.hpp"
#include "pgmutex/error.hpp"
#include "run_report.hpp"
#include "terminal_text.hpp"

namespace pgmutex::cli {

// How much `run` tells on stderr. quiet: only what changes the exit code,
// and a lost lock (cron mails whatever is printed). verbose: every lock event,
// a heartbeat that recovered after retries included.
enum class Verbosity { quiet, normal, verbose };

struct LockEvents {
  // Off for a single try: its one "taken" line already says the holder is late.
  bool report_alerts = true;
  Verbosity verbosity = Verbosity::normal;
  // Where the lease deadlines go (not owned; may be null).
  LeaseWatch* lease = nullptr;
  // Where heartbeat retries are counted (not owned; may be null).
  RunMetricsFile* report = nullptr;

  // Names and messages go through shown()/one_line(): each event is one line.
  void alert(std::string_view lock, std::string_view holder, double seconds) const {
    if (report_alerts && verbosity != Verbosity::quiet)
      std::fprintf(stderr, "pgmutex: alert: lock '%s': holder %s has not sent a heartbeat for %.1f s\n",
                   shown(lock).c_str(), shown(holder).c_str(), seconds);
  }
  void stale_reclaimed(std::string_view lock, std::string_view, std::string_view previous) const {
    if (verbosity != Verbosity::quiet)
      std::fprintf(stderr, "pgmutex: reclaimed stale lock '%s' from %s\n", shown(lock).c_str(), shown(previous).c_str());
  }
  void acquired(std::string_view lock, std::string_view, Fence fence) const {
    if (verbosity == Verbosity::verbose)
      std::fprintf(stderr, "pgmutex: acquired lock '%s' (fence %lld)\n", shown(lock).c_str(), static_cast<long long>(fence));
  }
  void released(std::string_view lock, std::string_view) const {
    if (verbosity == Verbosity::verbose) std::fprintf(stderr, "pgmutex: released lock '%s'\n", shown(lock).c_str());
  }
  void lease_renewed(std::string_view, std::string_view, std::chrono::nanoseconds deadline) const {
    if (lease != nullptr) lease->renewed(deadline);
  }
  void heartbeat_failed(std::string_view lock, std::string_view, const Error& error) const {
    if (report != nullptr) report->heartbeat_failed();
    if (verbosity != Verbosity::quiet)
      std::fprintf(stderr, "pgmutex: warning: heartbeat for lock '%s' failed, retrying: %s\n", shown(lock).c_str(),
                   one_line(error.message()).c_str());
  }
  void heartbeat_latency(std::string_view lock, std::string_view, double) const {
    const int failed = report != nullptr ? report->heartbeat_succeeded() : 0;
    if (failed > 0 && verbosity == Verbosity::verbose)
      std::fprintf(stderr, "pgmutex: heartbeat for lock '%s' recovered after %d failed tr%s\n", shown(lock).c_str(),
                   failed, failed == 1 ? "y" : "ies");
  }
};

}  // namespace pgmutex::cli
