// The Metrics policy of the command: the library's hooks, told on stderr.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include "pgmutex/error.hpp"

namespace pgmutex::cli {

struct LockEvents {
  // Off for a single try: its one "taken" line already says the holder is late.
  bool report_alerts = true;

  void alert(std::string_view lock, std::string_view holder, double seconds) const {
    if (report_alerts)
      std::fprintf(stderr, "pgmutex: alert: lock '%.*s': holder %.*s has not sent a heartbeat for %.1f s\n",
                   static_cast<int>(lock.size()), lock.data(), static_cast<int>(holder.size()), holder.data(), seconds);
  }
  void stale_reclaimed(std::string_view lock, std::string_view, std::string_view previous) const {
    std::fprintf(stderr, "pgmutex: reclaimed stale lock '%.*s' from %.*s\n", static_cast<int>(lock.size()), lock.data(),
                 static_cast<int>(previous.size()), previous.data());
  }
  void heartbeat_failed(std::string_view lock, std::string_view, const Error& error) const {
    const std::string text = error.message();
    std::fprintf(stderr, "pgmutex: warning: heartbeat for lock '%.*s' failed, retrying: %s\n",
                 static_cast<int>(lock.size()), lock.data(), text.c_str());
  }
};

}  // namespace pgmutex::cli
