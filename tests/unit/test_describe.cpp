// The records described once (Boost.Hana): the descriptions match the
// structs, validate() speaks their names and copies by them, and
// PrometheusMetrics, built on its description, is thread-safe and renders
// what promtool accepts.
#include "pgmutex/describe/lock_metrics.hpp"
#include "pgmutex/describe/options.hpp"
#include "pgmutex/describe/record.hpp"
#include "pgmutex/metrics/exposition.hpp"
#include "pgmutex/metrics/prometheus.hpp"

#include <boost/hana/zip.hpp>
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "pgmutex/metrics.hpp"
#include "pgmutex/testing/simulation.hpp"

using namespace std::chrono_literals;
namespace describe = pgmutex::describe;

namespace {

// promtool's verdict on `text`: its exit code and everything it printed (lint warnings included).
std::pair<int, std::string> promtool_check(const std::string& text) {
  char path[] = "/tmp/pgmutex-promtool-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  { std::ofstream(path) << text; }
  const std::string out_path = std::string(path) + ".out";
  const std::string command = "promtool check metrics < " + std::string(path) + " > " + out_path + " 2>&1";
  const int status = std::system(command.c_str());
  std::stringstream said;
  said << std::ifstream(out_path).rdbuf();
  std::remove(path);
  std::remove(out_path.c_str());
  ::close(fd);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, said.str()};
}

}  // namespace

TEST_CASE("each description names its record's members, in order", "[describe]") {
  STATIC_REQUIRE(describe::description_matches<pgmutex::Options>());
  STATIC_REQUIRE(describe::description_matches<pgmutex::ValidOptions>());
  STATIC_REQUIRE(describe::description_matches<pgmutex::LockMetrics>());
  STATIC_REQUIRE(describe::field_count<pgmutex::Options> == 10);
  for (const describe::Field& field : describe::Description<pgmutex::Options>::fields) {
    INFO(field.name);
    CHECK(!field.doc.empty());
  }
}

TEST_CASE("every duration option carries its unit, every option with a flag a --flag or words", "[describe]") {
  describe::for_each_field(pgmutex::Options{}, [](const describe::Field& field, const auto& value) {
    using T = std::remove_cvref_t<decltype(value)>;
    INFO(field.name);
    if constexpr (std::is_same_v<T, std::chrono::nanoseconds> ||
                  std::is_same_v<T, std::optional<std::chrono::nanoseconds>>)
      CHECK(field.unit == "seconds");
    else
      CHECK(field.unit.empty());
  });
  CHECK(describe::field_of(&pgmutex::Options::lock_name).flag == "--lock");
  CHECK(describe::field_of(&pgmutex::Options::stale_threshold).flag == "--stale-threshold");
  CHECK(describe::field_of(&pgmutex::Options::poll_interval).name == "poll_interval");
}

TEST_CASE("validate() names options as the description does", "[describe][options]") {
  pgmutex::Options options{.lock_name = "job", .instance_id = "a"};
  options.poll_interval = 0s;
  auto valid = pgmutex::validate(options);
  REQUIRE(!valid);
  CHECK(valid.error().detail.starts_with(std::string(describe::field_of(&pgmutex::Options::poll_interval).name) +
                                         " must be > 0"));
  options.poll_interval = 1s;
  options.alert_threshold = 700s;
  valid = pgmutex::validate(options);
  REQUIRE(!valid);
  CHECK(valid.error().detail == "alert_threshold (700s) must be < stale_threshold (600s)");
}

TEST_CASE("validate() copies every member into ValidOptions, defaults filled in", "[describe][options]") {
  const pgmutex::Options options{.lock_name = "job",
                                 .instance_id = "a",
                                 .table = "app.locks",
                                 .heartbeat_interval = 2s,
                                 .alert_threshold = 5s,
                                 .stale_threshold = 100s,
                                 .poll_interval = 250ms,
                                 .safety_margin = 20s,
                                 .heartbeat_timeout = 3s,
                                 .handoff_deadline = 1500ms};
  const auto valid = pgmutex::validate(options);
  REQUIRE(valid);
  int compared = 0;
  boost::hana::for_each(
      boost::hana::zip(boost::hana::accessors<pgmutex::Options>(), boost::hana::accessors<pgmutex::ValidOptions>()),
      [&](auto pair) {
        const auto& given = boost::hana::second(boost::hana::at_c<0>(pair))(options);
        const auto& kept = boost::hana::second(boost::hana::at_c<1>(pair))(*valid);
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(given)>, std::remove_cvref_t<decltype(kept)>>)
          CHECK(given == kept);
        else
          CHECK(*given == kept);
        ++compared;
      });
  CHECK(compared == 10);
  // Left out, the three are computed, and the instance id made up.
  const auto defaults = pgmutex::validate(pgmutex::Options{.lock_name = "job"});
  REQUIRE(defaults);
  CHECK(defaults->safety_margin == 60s);
  CHECK(defaults->heartbeat_timeout == 10s);
  CHECK(defaults->handoff_deadline == 2s);
  CHECK(!defaults->instance_id.empty());
  CHECK(defaults->lease() == 540s);
}

TEST_CASE("exposition numbers read back as the same double, shortest first", "[describe][prometheus]") {
  CHECK(pgmutex::exposition::number(0.0025) == "0.0025");
  CHECK(pgmutex::exposition::number(41) == "41");
  CHECK(pgmutex::exposition::number(1.0 / 3) == "0.3333333333333333");
  CHECK(std::strtod(pgmutex::exposition::number(29.067900086000002).c_str(), nullptr) == 29.067900086000002);
  CHECK(pgmutex::exposition::escape_label("a\"b\\c\nd") == "a\\\"b\\\\c\\nd");
}

TEST_CASE("PrometheusMetrics: histograms are cumulative, the +Inf bucket is the count", "[prometheus]") {
  pgmutex::PrometheusMetrics metrics;
  metrics.heartbeat_latency("job", "a", 0.003);
  metrics.heartbeat_latency("job", "a", 0.2);
  metrics.heartbeat_latency("job", "a", 30.0);  // past every bound: only +Inf
  const pgmutex::LatencyHistogram h = metrics.snapshot().at("job").heartbeat_latency;
  CHECK(h.count == 3);
  CHECK(h.sum == Approx(30.203));
  CHECK(h.buckets[1] == 0);  // le 0.0025
  CHECK(h.buckets[2] == 1);  // le 0.005
  CHECK(h.buckets[7] == 2);  // le 0.25
  CHECK(h.buckets.back() == 2);  // le 10
  const std::string text = metrics.render();
  CHECK(text.find("pgmutex_heartbeat_latency_seconds_bucket{lock=\"job\",le=\"0.005\"} 1\n") != std::string::npos);
  CHECK(text.find("pgmutex_heartbeat_latency_seconds_bucket{lock=\"job\",le=\"+Inf\"} 3\n") != std::string::npos);
  CHECK(text.find("pgmutex_heartbeat_latency_seconds_count{lock=\"job\"} 3\n") != std::string::npos);
}

TEST_CASE("PrometheusMetrics is a thread-safe handle: hooks from many threads all count", "[prometheus]") {
  STATIC_REQUIRE(pgmutex::Metrics<pgmutex::PrometheusMetrics>);
  pgmutex::PrometheusMetrics metrics;
  constexpr int threads = 4, calls = 5000;
  {
    std::vector<std::jthread> workers;
    for (int t = 0; t < threads; ++t)
      workers.emplace_back([copy = metrics, t]() mutable {  // each thread its own copy: copies share the numbers
        for (int i = 0; i < calls; ++i) {
          copy.acquired(t % 2 ? "odd" : "even", "a", i);
          copy.contended(t % 2 ? "odd" : "even", "a");
          copy.acquire_latency(t % 2 ? "odd" : "even", "a", 0.001);
          if (i % 100 == 0) (void)copy.render();  // render while others write
        }
      });
  }
  const auto numbers = metrics.snapshot();
  REQUIRE(numbers.size() == 2);
  CHECK(numbers.at("odd").acquired == 2 * calls);
  CHECK(numbers.at("even").contended == 2 * calls);
  CHECK(numbers.at("even").acquire_latency.count == 2 * calls);
  CHECK(numbers.at("even").acquire_latency.buckets[0] == 2 * calls);
}

TEST_CASE("PrometheusMetrics renders every described metric, and promtool accepts it silently", "[prometheus]") {
  pgmutex::testing::Simulation sim;
  pgmutex::PrometheusMetrics metrics;
  auto a = sim.instance(pgmutex::Options{.lock_name = "report \"daily\"\\\nv2", .instance_id = "a"}, metrics);
  auto b = sim.instance(pgmutex::Options{.lock_name = "report \"daily\"\\\nv2", .instance_id = "b"}, metrics);
  a.create_schema();
  auto held = a.try_acquire();
  REQUIRE(held);
  CHECK(!b.try_acquire());  // contended
  sim.advance(30s);         // heartbeats
  held.release();
  const std::string text = metrics.render();
  for (const describe::Field& field : describe::Description<pgmutex::LockMetrics>::fields) {
    INFO(field.metric);
    CHECK(text.find("# HELP " + std::string(field.metric) + " " + std::string(field.doc) + "\n") != std::string::npos);
    CHECK(text.find("# TYPE " + std::string(field.metric) + " " + std::string(field.metric_type) + "\n") !=
          std::string::npos);
  }
  const std::string lock = "lock=\"report \\\"daily\\\"\\\\\\nv2\"";
  CHECK(text.find("pgmutex_acquired_total{" + lock + "} 1\n") != std::string::npos);
  CHECK(text.find("pgmutex_released_total{" + lock + "} 1\n") != std::string::npos);
  CHECK(text.find("pgmutex_contended_total{" + lock + "} 1\n") != std::string::npos);
  CHECK(text.find("pgmutex_acquire_latency_seconds_count{" + lock + "} 1\n") != std::string::npos);
  CHECK(text.find("pgmutex_heartbeat_latency_seconds_count{" + lock + "} 3\n") != std::string::npos);

  const auto [code, said] = promtool_check(text);
  INFO(text);
  CHECK(said == "");
  CHECK(code == 0);
  // And promtool is no rubber stamp: a counter without _total is a lint failure.
  const auto [bad_code, bad_said] = promtool_check("# HELP x a counter\n# TYPE x counter\nx 1\n");
  CHECK(bad_code != 0);
  CHECK(bad_said.find("counter metrics should have \"_total\" suffix") != std::string::npos);
}
