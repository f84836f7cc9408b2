// An example metrics sink that keeps Prometheus counters and renders them in
// the text exposition format. A handle: copies share the counters, so the
// mutex keeps one copy and your /metrics endpoint another.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>

#include "pgmutex/metrics.hpp"

class PrometheusMetrics {
 public:
  void acquired(std::string_view lock, std::string_view, pgmutex::Fence) { add("pgmutex_acquired_total", lock); }
  void released(std::string_view lock, std::string_view) { add("pgmutex_released_total", lock); }
  void contended(std::string_view lock, std::string_view) { add("pgmutex_contended_total", lock); }
  void stale_reclaimed(std::string_view lock, std::string_view, std::string_view) {
    add("pgmutex_stale_reclaimed_total", lock);
  }
  void alert(std::string_view lock, std::string_view, double) { add("pgmutex_alerts_total", lock); }
  void heartbeat_latency(std::string_view lock, std::string_view, double seconds) {
    add("pgmutex_heartbeats_total", lock);
    add("pgmutex_heartbeat_seconds_total", lock, seconds);
  }
  void lost(std::string_view lock, std::string_view, const pgmutex::Error&) { add("pgmutex_lost_total", lock); }
  void heartbeat_failed(std::string_view lock, std::string_view, const pgmutex::Error&) {
    add("pgmutex_heartbeat_failures_total", lock);
  }

  // The text exposition format (version 0.0.4).
  [[nodiscard]] std::string render() const {
    std::lock_guard guard(state_->mutex);
    std::ostringstream out;
    std::string last_name;
    for (const auto& [key, value] : state_->counters) {
      if (key.first != last_name) out << "# TYPE " << key.first << " counter\n";
      last_name = key.first;
      out << key.first << "{lock=\"" << escape(key.second) << "\"} " << value << "\n";
    }
    return out.str();
  }

 private:
  void add(const char* name, std::string_view lock, double amount = 1.0) {
    std::lock_guard guard(state_->mutex);
    state_->counters[{name, std::string(lock)}] += amount;
  }
  static std::string escape(const std::string& label) {
    std::string out;
    for (char c : label) {
      if (c == '\\' || c == '"') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    return out;
  }
  struct State {
    std::mutex mutex;
    std::map<std::pair<std::string, std::string>, double> counters;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

static_assert(pgmutex::Metrics<PrometheusMetrics>);
