// Faults made real: the holder's connection terminated by the server, and the
// server restarted while a lock is held. Runs alone (it restarts the server).
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "pgmutex/testing/recording_metrics.hpp"
#include "support.hpp"

using namespace itest;
using pgmutex::Errc;
using pgmutex::PostgresBackend;
using RecordingMutex = pgmutex::BasicMutex<PostgresBackend, pgmutex::SteadyClock, pgmutex::testing::RecordingMetrics>;

namespace {

// The server pids of the sessions that named themselves `application_name`.
std::vector<int> sessions_of(const std::string& application_name) {
  std::vector<int> pids;
  for (const auto& row : admin("SELECT pid FROM pg_stat_activity WHERE application_name = '" + application_name + "'"))
    pids.push_back(row[0].as<int>());
  return pids;
}

void terminate_sessions_of(const std::string& application_name) {
  admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '" + application_name + "'");
  for (int i = 0; i < 100 && !sessions_of(application_name).empty(); ++i) std::this_thread::sleep_for(20ms);
  REQUIRE(sessions_of(application_name).empty());
}

}  // namespace

TEST_CASE("pg_terminate_backend on the holder's connection: it reconnects, keeps the lock, same fence",
          "[faults][terminate]") {
  const std::string table = fresh_table("terminate");
  const std::string app = "holder_" + std::to_string(::getpid());
  auto o = options(table, "job", "holder");
  o.heartbeat_interval = 1h;  // heartbeats only when the test says
  o.alert_threshold = 2h;
  o.stale_threshold = 3h;
  o.safety_margin = 1h + 10min;  // heartbeats commit asynchronously: the margin covers an interval more
  pgmutex::testing::RecordingMetrics metrics;
  RecordingMutex holder(PostgresBackend("application_name=" + app), o, {}, metrics);
  holder.create_schema();
  auto guard = holder.try_acquire();
  REQUIRE(guard);
  const auto fence = guard.fence();
  const auto before = sessions_of(app);
  REQUIRE(before.size() == 1);

  terminate_sessions_of(app);
  guard.heartbeat();  // the dead connection is noticed, replaced, and the heartbeat lands
  const auto after = sessions_of(app);
  REQUIRE(after.size() == 1);
  CHECK(after[0] != before[0]);
  CHECK_FALSE(guard.lost());
  const auto row = holder.inspect();
  REQUIRE(row.has_value());
  CHECK(row->instance_id == "holder");
  CHECK(row->fence == fence);
  CHECK(row->seconds_since_heartbeat < 1.0);

  SECTION("a release on a terminated connection still removes the row") {
    terminate_sessions_of(app);
    guard.release();
    CHECK_FALSE(holder.inspect().has_value());
  }
  SECTION("an acquire on a terminated connection resolves its unknown outcome by reading the row back") {
    guard.release();
    terminate_sessions_of(app);
    auto again = holder.acquire(std::chrono::nanoseconds(5s));
    REQUIRE(again);
    CHECK(again.fence() > fence);
    const auto now_row = holder.inspect();
    REQUIRE(now_row.has_value());
    CHECK(now_row->fence == again.fence());
  }
}

TEST_CASE("a reconnect after pg_terminate_backend shows as a new server session", "[faults][terminate][session]") {
  // Asynchronous heartbeats are confirmed only within one session: the
  // backend must report a new one once its connection was replaced.
  const std::string table = fresh_table("session");
  const std::string app = "session_" + std::to_string(::getpid());
  PostgresBackend b("application_name=" + app);
  REQUIRE(b.create_schema(table));
  auto won = b.try_acquire(pgmutex::AcquireRequest{pgmutex::LockRef{table, "job"}, "holder", 600s, 31, 5s});
  REQUIRE(won);
  REQUIRE(won->acquired);
  const pgmutex::HolderKey key{pgmutex::LockRef{table, "job"}, "holder", won->fence, 31, 5s};
  REQUIRE(b.heartbeat(key));
  const std::uint64_t first = b.session();
  REQUIRE(b.heartbeat(key));
  CHECK(b.session() == first);  // the same connection: the same session

  terminate_sessions_of(app);
  REQUIRE(b.heartbeat(key));  // retried on a fresh connection
  CHECK(b.session() != first);
  CHECK(b.release(key));
}

TEST_CASE("Postgres restarted while a lock is held: the lock survives and heartbeats resume", "[faults][restart]") {
  const Server s = server();
  const std::string table = fresh_table("restart");
  auto o = options(table, "job", "holder");
  o.heartbeat_interval = 200ms;
  o.alert_threshold = 5s;
  o.stale_threshold = 30s;
  pgmutex::testing::RecordingMetrics metrics;
  pgmutex::PostgresOptions po;
  po.reconnect_attempts = 2;
  po.reconnect_backoff = 50ms;
  RecordingMutex holder(PostgresBackend("", po), o, {}, metrics);
  holder.create_schema();
  auto guard = holder.acquire(std::chrono::nanoseconds(5s));
  REQUIRE(guard);
  const auto fence = guard.fence();
  std::this_thread::sleep_for(500ms);
  REQUIRE(metrics.count("heartbeat_latency") >= 1);

  // Stop, stay down long enough for heartbeats to fail, start again.
  REQUIRE(std::system((s.pgctl + " -m fast stop >/dev/null").c_str()) == 0);
  std::this_thread::sleep_for(1s);
  REQUIRE(std::system((s.pgctl + " start >/dev/null").c_str()) == 0);
  CHECK(metrics.count("heartbeat_failed") >= 1);

  // Heartbeats resume on a new connection.
  const auto beats = metrics.count("heartbeat_latency");
  for (int i = 0; i < 50 && metrics.count("heartbeat_latency") <= beats; ++i) std::this_thread::sleep_for(100ms);
  CHECK(metrics.count("heartbeat_latency") > beats);
  CHECK_FALSE(guard.lost());
  guard.heartbeat();
  const auto row = holder.inspect();
  REQUIRE(row.has_value());
  CHECK(row->fence == fence);
  CHECK(row->instance_id == "holder");
  CHECK(row->seconds_since_heartbeat < 1.0);
  CHECK(metrics.count("lost") == 0);
  guard.release();
  CHECK_FALSE(holder.inspect().has_value());
}
