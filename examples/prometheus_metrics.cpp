// The Prometheus sink at work: a crash and a takeover in virtual time, then
// the counters as a /metrics endpoint would serve them.
#include <cstdio>

#include "pgmutex/testing/simulation.hpp"
#include "prometheus_metrics.hpp"

using namespace std::chrono_literals;

int main() {
  pgmutex::testing::Simulation sim;
  PrometheusMetrics metrics;
  auto a = sim.instance(pgmutex::Options{.lock_name = "nightly-report-job", .instance_id = "a"}, metrics);
  auto b = sim.instance(pgmutex::Options{.lock_name = "nightly-report-job", .instance_id = "b"}, metrics);
  a.create_schema();
  auto held = a.try_acquire();
  sim.advance(1min);
  sim.server().partition("a");
  for (int i = 0; i < 80; ++i) {
    sim.advance(10s);
    if (auto taken = b.try_acquire()) break;  // b takes over once a's row is stale; released here
  }
  const std::string text = metrics.render();
  std::fputs(text.c_str(), stdout);
  // The story must show in the counters.
  const bool ok = text.find("pgmutex_alerts_total{lock=\"nightly-report-job\"} 1") != std::string::npos &&
                  text.find("pgmutex_stale_reclaimed_total{lock=\"nightly-report-job\"} 1") != std::string::npos &&
                  text.find("pgmutex_lost_total{lock=\"nightly-report-job\"} 1") != std::string::npos;
  return ok ? 0 : 1;
}
