// The seed's quickstart and API through pgmutex::Mutex on a real server, a
// holder killed with SIGKILL (alert, then reclaim), and 8 processes x 200
// acquisitions of one lock checked for overlap and fence order.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>
#include <tuple>

#include "pgmutex/testing/recording_metrics.hpp"
#include "support.hpp"

using namespace itest;
using pgmutex::Errc;
using pgmutex::Mutex;
using pgmutex::PostgresBackend;
using RecordingMutex = pgmutex::BasicMutex<PostgresBackend, pgmutex::SteadyClock, pgmutex::testing::RecordingMetrics>;

TEST_CASE("the seed's quickstart", "[mutex][quickstart]") {
  const std::string table = fresh_table("quick");
  Mutex mutex(PostgresBackend(""), options(table, "nightly-report-job"));
  mutex.create_schema();
  mutex.create_schema();  // idempotent

  Mutex other(PostgresBackend(""), options(table, "nightly-report-job"));
  CHECK(mutex.instance_id() != other.instance_id());
  int runs = 0;
  {
    auto acquired = mutex.try_acquire();
    REQUIRE(acquired);
    ++runs;  // run_the_job()
    auto refused = other.try_acquire();
    CHECK_FALSE(refused);
    CHECK(refused.why() == Errc::lock_held);
    REQUIRE(refused.holder().has_value());
    CHECK(refused.holder()->instance_id == mutex.instance_id());
    CHECK(refused.holder()->fence == acquired.fence());
  }  // released here: the next instance need not wait out any threshold
  auto next = other.try_acquire();
  CHECK(next);
  CHECK(runs == 1);
}

TEST_CASE("acquire with a timeout, release, heartbeat, fences", "[mutex][api]") {
  const std::string table = fresh_table("api");
  Mutex holder(PostgresBackend(""), options(table, "job", "holder"));
  holder.create_schema();
  auto o = options(table, "job", "waiter");
  o.poll_interval = 5s;  // only the release's NOTIFY can wake the waiter in time
  Mutex waiter(PostgresBackend(""), o);

  auto guard = holder.acquire(std::chrono::nanoseconds(2s));
  REQUIRE(guard);
  const auto first_fence = guard.fence();
  CHECK(holder.held());
  guard.heartbeat();
  holder.heartbeat();

  SECTION("a blocking acquire times out while the lock is held") {
    auto t0 = std::chrono::steady_clock::now();
    auto timed_out = waiter.acquire(std::chrono::nanoseconds(300ms));
    const auto waited = std::chrono::steady_clock::now() - t0;
    CHECK_FALSE(timed_out);
    CHECK(timed_out.why() == Errc::timeout);
    CHECK(waited >= 290ms);
    CHECK(waited < 3s);
  }
  SECTION("a blocking acquire wakes on the release's NOTIFY, well before its poll interval") {
    std::thread releaser([&] {
      std::this_thread::sleep_for(300ms);
      guard.release();
    });
    auto t0 = std::chrono::steady_clock::now();
    auto got = waiter.acquire(std::chrono::nanoseconds(20s));
    const auto waited = std::chrono::steady_clock::now() - t0;
    releaser.join();
    REQUIRE(got);
    CHECK(waited < 2s);
    CHECK(got.fence() > first_fence);
  }
  SECTION("release, then release again, is refused") {
    holder.release();
    CHECK_FALSE(holder.held());
    CHECK_THROWS_AS(holder.release(), pgmutex::LockNotHeldError);
    CHECK_FALSE(holder.inspect().has_value());
  }
  SECTION("acquiring again through the same object is refused, not deadlocked") {
    auto again = holder.try_acquire(pgmutex::nothrow);
    REQUIRE_FALSE(again);
    CHECK(again.error() == Errc::already_acquired);
  }
  SECTION("a heartbeat after the row was removed reports the lock lost") {
    admin("DELETE FROM " + table);
    CHECK_THROWS_AS(guard.heartbeat(), pgmutex::LockNotHeldError);
    CHECK(guard.lost());
    CHECK(guard.stop_token().stop_requested());
  }
  SECTION("singleton runs the function only while holding the lock") {
    int runs = 0;
    auto job = waiter.singleton([&] { ++runs; });
    CHECK_FALSE(job());  // the holder has it
    guard.release();
    CHECK(job());
    CHECK(runs == 1);
  }
}

TEST_CASE("automatic heartbeats keep the row fresh", "[mutex][heartbeat]") {
  const std::string table = fresh_table("auto");
  auto o = options(table, "job");
  o.heartbeat_interval = 100ms;
  o.alert_threshold = 1s;
  o.stale_threshold = 3s;
  pgmutex::testing::RecordingMetrics metrics;
  RecordingMutex mutex(PostgresBackend(""), o, {}, metrics);
  mutex.create_schema();
  auto guard = mutex.acquire();
  REQUIRE(guard);
  std::this_thread::sleep_for(700ms);
  const auto row = mutex.inspect();
  REQUIRE(row.has_value());
  CHECK(row->seconds_since_heartbeat < 0.5);
  CHECK(metrics.count("heartbeat_latency") >= 3);
  CHECK(metrics.count("heartbeat_failed") == 0);
  CHECK_FALSE(guard.lost());
}

TEST_CASE("a holder killed with SIGKILL: the alert fires, then the lock is reclaimed", "[mutex][crash]") {
  const std::string table = fresh_table("crash");
  {
    Mutex setup(PostgresBackend(""), options(table, "job"));
    setup.create_schema();
  }
  Child child = spawn_child({"hold", table, "job", "doomed-holder"});
  const std::string line = read_line(child, 10s);
  REQUIRE(line.starts_with("acquired "));
  const pgmutex::Fence child_fence = std::stoll(line.substr(9));

  auto o = options(table, "job", "survivor");
  o.heartbeat_interval = 200ms;
  o.alert_threshold = 1s;
  o.stale_threshold = 2s;
  o.poll_interval = 100ms;
  // A long attempt time: with the default (0.1 s) a loaded machine may count
  // an acquire's reply as lost; the row read back then does not say whom it
  // replaced, and stale_reclaimed stays silent (metrics.hpp).
  o.safety_margin = 900ms;
  o.heartbeat_timeout = 600ms;  // + one interval, for asynchronous heartbeats: <= the margin
  pgmutex::testing::RecordingMetrics metrics;
  RecordingMutex survivor(PostgresBackend(""), o, {}, metrics);
  std::this_thread::sleep_for(1200ms);  // alive: heartbeats keep it below the alert threshold
  CHECK_FALSE(survivor.try_acquire());
  CHECK(metrics.count("alert") == 0);

  REQUIRE(::kill(child.pid, SIGKILL) == 0);
  CHECK(wait_child(child) == 128 + SIGKILL);
  const auto killed = std::chrono::steady_clock::now();

  auto guard = survivor.acquire(std::chrono::nanoseconds(10s));
  const auto after = std::chrono::steady_clock::now() - killed;
  REQUIRE(guard);
  CHECK(guard.fence() > child_fence);
  CHECK(after >= 1500ms);  // not before the stale threshold (2s since the last heartbeat)
  CHECK(after < 5s);

  const auto alerts = metrics.events("alert");
  REQUIRE(alerts.size() == 1);  // once per holder and fence
  CHECK(alerts[0].who == "doomed-holder");
  CHECK(alerts[0].seconds >= 1.0);
  const auto reclaimed = metrics.events("stale_reclaimed");
  REQUIRE(reclaimed.size() == 1);
  CHECK(reclaimed[0].other == "doomed-holder");
  // The alert came before the reclaim.
  const auto events = metrics.events();
  const auto alert_at = std::ranges::find_if(events, [](const auto& e) { return e.hook == "alert"; });
  const auto reclaim_at = std::ranges::find_if(events, [](const auto& e) { return e.hook == "stale_reclaimed"; });
  CHECK(alert_at < reclaim_at);
}

TEST_CASE("8 processes x 200 acquisitions of one lock: no overlap, fences strictly increase", "[mutex][stress]") {
  const std::string table = fresh_table("stress");
  {
    Mutex setup(PostgresBackend(""), options(table, "hot"));
    setup.create_schema();
  }
  constexpr int processes = 8;
  constexpr int acquisitions = 200;
  char dir_template[] = "/tmp/pgmutex-stress.XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;

  std::vector<Child> children;
  for (int i = 0; i < processes; ++i)
    children.push_back(spawn_child({"stress", table, "hot", std::to_string(acquisitions), dir + "/" + std::to_string(i)}));
  for (Child& c : children) CHECK(wait_child(c) == 0);

  struct Hold {
    pgmutex::Fence fence;
    long long start;
    long long end;
    int process;
  };
  std::vector<Hold> holds;
  for (int i = 0; i < processes; ++i) {
    const std::string file = dir + "/" + std::to_string(i);
    std::ifstream in(file);
    Hold h{};
    h.process = i;
    int count = 0;
    while (in >> h.fence >> h.start >> h.end) {
      holds.push_back(h);
      ++count;
    }
    CHECK(count == acquisitions);
    ::unlink(file.c_str());
  }
  ::rmdir(dir.c_str());
  REQUIRE(holds.size() == static_cast<std::size_t>(processes * acquisitions));

  std::ranges::sort(holds, {}, &Hold::start);
  int overlaps = 0;
  int out_of_order = 0;
  for (std::size_t i = 1; i < holds.size(); ++i) {
    if (holds[i].start < holds[i - 1].end) ++overlaps;
    if (holds[i].fence <= holds[i - 1].fence) ++out_of_order;
  }
  CHECK(overlaps == 0);
  CHECK(out_of_order == 0);
}
