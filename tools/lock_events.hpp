// The Metrics policy of the command: the library's hooks, told on stderr, and
// the lease deadlines, handed to the guard process that enforces them too
// (lease_watch.hpp).
#pragma once

#include <chrono>
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
  // Where the lease deadlines go (not owned; may be null).
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
  void lease_renewed(std::string_view, std::string_view, std::chrono::nanoseconds deadline) const {
    if (lease != nullptr) lease->renewed(deadline);
  }
  void heartbeat_failed(std::string_view lock, std::string_view, const Error& error) const {
    std::fprintf(stderr, "pgmutex: warning: heartbeat for lock '%s' failed, retrying: %s\n", shown(lock).c_str(),
                 one_line(error.message()).c_str());
  }
};

}  // namespace pgmutex::cli
