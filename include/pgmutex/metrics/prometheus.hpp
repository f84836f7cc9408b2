// PrometheusMetrics: a metrics sink that keeps per-lock counters and latency
// histograms and renders them in the Prometheus text exposition format.
//
//   pgmutex::PrometheusMetrics metrics;                 // a handle: copies share the numbers
//   pgmutex::BasicMutex<pgmutex::PostgresBackend, pgmutex::SteadyClock, pgmutex::PrometheusMetrics>
//       mutex(std::move(backend), options, {}, metrics);
//   ... serve metrics.render() on /metrics, or write it for node_exporter's textfile collector.
//
// Thread-safe: each hook takes a short lock around a few additions (never I/O);
// render() copies the numbers under that lock and formats them outside it.
// The metrics, their docs and the README's table come from one description
// (describe/lock_metrics.hpp), which render() walks.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "pgmutex/backend.hpp"
#include "pgmutex/error.hpp"

namespace pgmutex {

// Seconds, cumulative as Prometheus counts them: bucket i counts observations <= bounds[i].
struct LatencyHistogram {
  static constexpr std::array<double, 12> bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                    0.1,   0.25,   0.5,   1.0,  2.5,   10.0};
  std::array<std::uint64_t, bounds.size()> buckets{};
  std::uint64_t count = 0;
  double sum = 0.0;

  void observe(double seconds) noexcept {
    for (std::size_t i = 0; i < bounds.size(); ++i)
      if (seconds <= bounds[i]) ++buckets[i];
    ++count;
    sum += seconds;
  }
};

// What PrometheusMetrics keeps for one lock. Described in describe/lock_metrics.hpp.
struct LockMetrics {
  std::uint64_t acquired = 0;
  std::uint64_t released = 0;
  std::uint64_t contended = 0;
  std::uint64_t stale_reclaimed = 0;
  std::uint64_t lost = 0;
  std::uint64_t alerts = 0;
  std::uint64_t heartbeat_failures = 0;
  LatencyHistogram acquire_latency;
  LatencyHistogram heartbeat_latency;
};

class PrometheusMetrics {
 public:
  void acquired(std::string_view lock, std::string_view, Fence) { update(lock, [](LockMetrics& m) { ++m.acquired; }); }
  void released(std::string_view lock, std::string_view) { update(lock, [](LockMetrics& m) { ++m.released; }); }
  void contended(std::string_view lock, std::string_view) { update(lock, [](LockMetrics& m) { ++m.contended; }); }
  void stale_reclaimed(std::string_view lock, std::string_view, std::string_view) {
    update(lock, [](LockMetrics& m) { ++m.stale_reclaimed; });
  }
  void alert(std::string_view lock, std::string_view, double) { update(lock, [](LockMetrics& m) { ++m.alerts; }); }
  void lost(std::string_view lock, std::string_view, const Error&) { update(lock, [](LockMetrics& m) { ++m.lost; }); }
  void heartbeat_failed(std::string_view lock, std::string_view, const Error&) {
    update(lock, [](LockMetrics& m) { ++m.heartbeat_failures; });
  }
  void acquire_latency(std::string_view lock, std::string_view, double seconds) {
    update(lock, [seconds](LockMetrics& m) { m.acquire_latency.observe(seconds); });
  }
  void heartbeat_latency(std::string_view lock, std::string_view, double seconds) {
    update(lock, [seconds](LockMetrics& m) { m.heartbeat_latency.observe(seconds); });
  }

  // The numbers of every lock seen so far, by lock name.
  [[nodiscard]] std::map<std::string, LockMetrics, std::less<>> snapshot() const {
    std::lock_guard hold(state_->mutex);
    return state_->locks;
  }

  // The text exposition format (version 0.0.4): # HELP and # TYPE for every
  // metric, a sample per lock, labelled lock="...".
  [[nodiscard]] std::string render() const;

 private:
  template <class F>
  void update(std::string_view lock, F&& change) {
    std::lock_guard hold(state_->mutex);
    auto at = state_->locks.find(lock);
    if (at == state_->locks.end()) at = state_->locks.emplace(std::string(lock), LockMetrics{}).first;
    change(at->second);
  }

  struct State {
    std::mutex mutex;
    std::map<std::string, LockMetrics, std::less<>> locks;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace pgmutex
