// pgmutex::PrometheusMetrics at work: a crash and a takeover in virtual time,
// then the metrics as a scrape would read them, written the way node_exporter's
// textfile collector wants them (a temporary file, then a rename).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "pgmutex/metrics/prometheus.hpp"
#include "pgmutex/testing/simulation.hpp"

using namespace std::chrono_literals;

// Call it every few seconds (a timer, a thread), or at exit for a short job.
bool write_textfile(const pgmutex::PrometheusMetrics& metrics, const std::filesystem::path& path) {
  const std::filesystem::path temporary = path.parent_path() / ("." + path.filename().string() + ".tmp");
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << metrics.render();
    if (!out.flush()) return false;
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);  // atomic: a scrape sees the old file or the new one
  return !error;
}

int main(int argc, char** argv) {
  pgmutex::testing::Simulation sim;
  pgmutex::PrometheusMetrics metrics;  // a handle: the mutexes and the exporter share its numbers
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
  if (argc > 1 && !write_textfile(metrics, argv[1])) return 1;
  // The story must show in the metrics.
  const bool ok = text.find("pgmutex_alerts_total{lock=\"nightly-report-job\"} 1") != std::string::npos &&
                  text.find("pgmutex_stale_reclaimed_total{lock=\"nightly-report-job\"} 1") != std::string::npos &&
                  text.find("pgmutex_lost_total{lock=\"nightly-report-job\"} 1") != std::string::npos &&
                  text.find("pgmutex_acquired_total{lock=\"nightly-report-job\"} 2") != std::string::npos &&
                  text.find("pgmutex_acquire_latency_seconds_count{lock=\"nightly-report-job\"} 2") != std::string::npos;
  return ok ? 0 : 1;
}
