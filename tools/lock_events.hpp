// The Metrics policy of the command: the library's hooks, told on stderr, and
// fed to the lease's estimate that the guard process enforces (lease_watch.hpp).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include "lease_watch.hpp"
#include "pgmutex/error.hpp"
#include "terminal_text.hpp"

namespace pgmutex::cli {

struct LockEvents {
  // Off for a single try: its one "taken" line already says the holder is late.
  bool report_alerts = true;
  // Where the acquire's and the heartbeats' send times go (not owned; may be null).
  LeaseWatch* lease = nullptr;

  // Names and messages go through shown()/one_line(): each event is one line.
  void alert(std::string_view lock, std::string_view holder, double seconds) const {
    if (report_alerts)
      std::fprintf(stderr, "pgmutex: alert: lock '%s': holder %s has not sent a heartbeat for %.1f s\n",
                   shown(lock).c_str(), shown(holder).c_str(), seconds);
  }
  void stale_reclaimed(std::string_view lock, std::string_view, std::string_view previous) const {
    std::fprintf(stderr, "pgmutex: reclaimed stale lock '%s' from %s\n", shown(lock).c_str(), shown(previous).c_str());
  }
  void acquire_latency(std::string_view, std::string_view, double seconds) const {
    if (lease != nullptr) lease->acquired(seconds);
  }
  void heartbeat_latency(std::string_view, std::string_view, double seconds) const {
    if (lease != nullptr) lease->beat_succeeded(seconds);
  }
  void heartbeat_failed(std::string_view lock, std::string_view, const Error& error) const {
    if (lease != nullptr) lease->beat_failed();
    std::fprintf(stderr, "pgmutex: warning: heartbeat for lock '%s' failed, retrying: %s\n", shown(lock).c_str(),
                 one_line(error.message()).c_str());
  }
};

}  // namespace pgmutex::cli
