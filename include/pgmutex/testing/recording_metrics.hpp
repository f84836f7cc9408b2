// A metrics sink that records every hook call, for tests (yours and ours).
// A handle: copies share one record, so the test keeps a copy and the mutex another.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "pgmutex/backend.hpp"
#include "pgmutex/error.hpp"

namespace pgmutex::testing {

struct MetricsEvent {
  std::string hook = {};  // "acquired", "alert", ...
  std::string lock_name = {};
  std::string who = {};    // instance_id, or the holder for "alert"
  std::string other = {};  // previous_holder for "stale_reclaimed", error message for "lost"/"heartbeat_failed"
  double seconds = 0.0;  // "alert", "heartbeat_latency"
  Fence fence = 0;       // "acquired"
};

class RecordingMetrics {
 public:
  void acquired(std::string_view l, std::string_view i, Fence f) { add({"acquired", std::string(l), std::string(i), {}, 0, f}); }
  void released(std::string_view l, std::string_view i) { add({"released", std::string(l), std::string(i)}); }
  void contended(std::string_view l, std::string_view i) { add({"contended", std::string(l), std::string(i)}); }
  void stale_reclaimed(std::string_view l, std::string_view i, std::string_view previous) {
    add({"stale_reclaimed", std::string(l), std::string(i), std::string(previous)});
  }
  void alert(std::string_view l, std::string_view holder, double seconds) {
    add({"alert", std::string(l), std::string(holder), {}, seconds});
  }
  void heartbeat_latency(std::string_view l, std::string_view i, double seconds) {
    add({"heartbeat_latency", std::string(l), std::string(i), {}, seconds});
  }
  void lost(std::string_view l, std::string_view i, const Error& reason) {
    add({"lost", std::string(l), std::string(i), reason.message()});
  }
  void heartbeat_failed(std::string_view l, std::string_view i, const Error& error) {
    add({"heartbeat_failed", std::string(l), std::string(i), error.message()});
  }

  [[nodiscard]] std::vector<MetricsEvent> events() const {
    std::lock_guard lock(record_->mutex);
    return record_->events;
  }
  [[nodiscard]] std::vector<MetricsEvent> events(std::string_view hook) const {
    auto all = events();
    std::erase_if(all, [&](const MetricsEvent& e) { return e.hook != hook; });
    return all;
  }
  [[nodiscard]] std::size_t count(std::string_view hook) const { return events(hook).size(); }
  void clear() {
    std::lock_guard lock(record_->mutex);
    record_->events.clear();
  }

 private:
  void add(MetricsEvent e) {
    std::lock_guard lock(record_->mutex);
    record_->events.push_back(std::move(e));
  }
  struct Record {
    std::mutex mutex;
    std::vector<MetricsEvent> events;
  };
  std::shared_ptr<Record> record_ = std::make_shared<Record>();
};

}  // namespace pgmutex::testing
