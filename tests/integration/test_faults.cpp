// Faults made real: the holder's connection terminated by the server, and the
// server restarted while a lock is held. Runs alone (it restarts the server).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

#include "fault_proxy.hpp"
#include "pgmutex/testing/recording_metrics.hpp"
#include "support.hpp"

using namespace itest;
using pgmutex::Errc;
using pgmutex::PostgresBackend;
using RecordingMutex = pgmutex::BasicMutex<PostgresBackend, pgmutex::SteadyClock, pgmutex::testing::RecordingMetrics>;

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

namespace {

// A DBA's server: synchronous_commit off for every session, and a WAL writer
// that flushes every 10 s (its largest delay). Undone when the test ends.
struct LazyDurability {
  LazyDurability() {
    admin("ALTER SYSTEM SET synchronous_commit = off");
    admin("ALTER SYSTEM SET wal_writer_delay = '10s'");
    admin("SELECT pg_reload_conf()");
  }
  ~LazyDurability() {
    try {
      admin("ALTER SYSTEM RESET synchronous_commit");
      admin("ALTER SYSTEM RESET wal_writer_delay");
      admin("SELECT pg_reload_conf()");
    } catch (...) {
    }
  }
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

// The server's own settings must not make acknowledged heartbeats count:
// with synchronous_commit off on the server and a 10 s WAL writer, a crash
// forgets the heartbeats it acknowledged since the last flush. The holder is
// cut off by a frozen proxy, the server crashes (immediate shutdown), and a
// rival connected directly waits for the row to go stale. The holder must
// know it lost before the rival is granted: it counted its lease only from
// heartbeats the server had made durable (forced synchronous commits, or
// asynchronous ones a later WAL flush position covered).
TEST_CASE("synchronous_commit off on the server, then a crash: the holder counted only heartbeats the server kept",
          "[faults][durability]") {
  const bool asynchronous_beats = GENERATE(true, false);
  CAPTURE(asynchronous_beats);
  const Server s = server();
  const std::string table = fresh_table("durability");
  RecordingMutex(PostgresBackend(""), options(table, "job")).create_schema();
  const LazyDurability lazy;

  FaultProxy proxy;
  pgmutex::PostgresOptions po;
  po.heartbeat_synchronous_commit_off = asynchronous_beats;
  po.reconnect_attempts = 1;
  auto o = options(table, "job", "holder");
  o.heartbeat_interval = 200ms;
  o.alert_threshold = 1s;
  o.stale_threshold = 4s;
  o.safety_margin = 1500ms;
  o.heartbeat_timeout = 500ms;  // lease 2.5 s
  pgmutex::testing::RecordingMetrics metrics;
  RecordingMutex holder(PostgresBackend(proxy.dsn(), po), o, {}, metrics);
  auto guard = holder.acquire(std::chrono::nanoseconds(5s));
  REQUIRE(guard);
  std::atomic<std::chrono::steady_clock::rep> lost_at{0};
  std::stop_callback on_lost(guard.stop_token(),
                             [&] { lost_at = std::chrono::steady_clock::now().time_since_epoch().count(); });
  std::this_thread::sleep_for(3s);  // beats acknowledged; with asynchronous ones, durable beats at half the lease
  REQUIRE(metrics.count("heartbeat_latency") >= 5);
  CHECK_FALSE(guard.lost());  // a healthy server with a slow WAL writer keeps the lock

  proxy.set("freeze");
  const auto frozen = std::chrono::steady_clock::now();
  REQUIRE(std::system((s.pgctl + " restart -m immediate >/dev/null").c_str()) == 0);

  auto ro = options(table, "job", "rival");
  ro.heartbeat_interval = 200ms;
  ro.alert_threshold = 1s;
  ro.stale_threshold = 4s;
  RecordingMutex rival(PostgresBackend(""), ro);
  std::optional<pgmutex::LockRow> row;
  for (int i = 0; i < 50 && !row; ++i) {  // the server accepts connections again
    auto read = rival.inspect(pgmutex::nothrow);
    if (read) row = *read;
    else std::this_thread::sleep_for(100ms);
  }
  REQUIRE(row);
  // How much acknowledged heartbeat time the crash forgot: the row's age
  // beyond the time since the holder was cut off (its last beat then).
  const double forgotten = row->seconds_since_heartbeat - seconds_since(frozen);
  auto won = rival.acquire(std::chrono::nanoseconds(15s));
  REQUIRE(won);
  const auto granted = std::chrono::steady_clock::now().time_since_epoch().count();
  for (int i = 0; i < 100 && lost_at == 0; ++i) std::this_thread::sleep_for(50ms);
  INFO("forgotten by the crash: " << forgotten << " s; holder lost "
                                  << static_cast<double>(granted - lost_at.load()) / 1e9 << " s before the rival's grant");
  REQUIRE(lost_at != 0);
  CHECK(lost_at < granted);
  // Forced synchronous commits: nothing acknowledged was lost. (Asynchronous
  // ones: what came after the last durable beat, up to half the lease.)
  if (!asynchronous_beats) CHECK(forgotten < 0.5);
  won.release();
  proxy.set("pass");
}

// A queued waiter's confirm may commit without its WAL flush
// (PostgresOptions::unflushed_confirm_window): its grant is provisional, and
// ends at the offer's deadline at the latest (AcquireResult::provisional_for).
// Here the server crashes between that commit and any flush (a 10 s WAL
// writer, immediate shutdown): the crash takes the confirm back, the offer
// stands again, and the waiter behind must not be granted the lock before
// the first waiter's provisional end; it is granted once the offer lapses.
// Driven through the backend's API, so that no heartbeat makes the grant
// durable first.
TEST_CASE("a confirm committed without its flush, then a crash: the offer stands again, and the next waiter is "
          "granted only after the provisional end",
          "[faults][durability][queue]") {
  using namespace pgmutex;
  const Server s = server();
  const std::string table = fresh_table("unflushed");
  const LockRef lock{table, "job"};
  PostgresBackend holder("");
  REQUIRE(holder.create_schema(table));
  const LazyDurability lazy;
  const auto request = [&](const std::string& name, GrantToken token) {
    AcquireRequest r{lock, name, 60s};
    r.token = token;
    r.timeout = 5s;
    return r;
  };
  const std::string h_name = "h", w_name = "w", r_name = "r";
  auto held = holder.try_acquire(request(h_name, 0x11));
  REQUIRE(held);
  REQUIRE(held->acquired);
  PostgresBackend w(""), r("");
  AcquireRequest wr = request(w_name, 0x22), rr = request(r_name, 0x33);
  auto wp = w.enqueue(wr, 3s);
  REQUIRE(wp);
  wr.queue_ticket = wp->ticket;
  auto rp = r.enqueue(rr, 3s);
  REQUIRE(rp);
  rr.queue_ticket = rp->ticket;
  const auto w_places = [&](const std::string& where) {
    return admin("SELECT count(*) FROM " + table + "_queue WHERE instance_id = 'w'" + where)[0][0].as<long long>();
  };

  REQUIRE(holder.release(HolderKey{lock, h_name, held->fence, 0x11}));  // offered to w, durably
  auto woke = w.wait_in_queue(WatchRequest{lock, 60s}, wp->ticket, 10s, {});
  REQUIRE(woke);
  REQUIRE(*woke == QueueWake::turn);
  const auto sent = std::chrono::steady_clock::now();
  auto won = w.try_acquire(wr);
  REQUIRE(won);
  REQUIRE(won->acquired);
  INFO("provisional for " << std::chrono::duration<double>(won->provisional_for).count() << " s");
  REQUIRE(won->provisional_for > 2s);  // committed unflushed: the offer had almost all of its 3 s left
  CHECK(won->provisional_for <= 3s);
  const auto provisional_end = sent + won->provisional_for;
  REQUIRE(w_places("") == 0);  // the confirm took w's place out (not yet durably)

  REQUIRE(std::system((s.pgctl + " restart -m immediate >/dev/null").c_str()) == 0);
  REQUIRE(eventually([&] {
    try {
      return w_places(" AND offered_fence IS NOT NULL") == 1;  // the crash took the confirm back
    } catch (const std::exception&) {
      return false;  // not accepting connections yet
    }
  }));

  const auto back = std::chrono::steady_clock::now();  // the server answers again (a busy machine: seconds)
  // r, now first behind a standing offer, looks until it is granted.
  std::optional<std::chrono::steady_clock::time_point> granted;
  while (!granted && std::chrono::steady_clock::now() < provisional_end + 10s) {
    auto took = r.try_acquire(rr);
    if (took && took->acquired) granted = std::chrono::steady_clock::now();
    else std::this_thread::sleep_for(50ms);
  }
  REQUIRE(granted);
  INFO("r granted " << std::chrono::duration<double>(*granted - provisional_end).count() << " s after w's end");
  CHECK(*granted >= provisional_end);
  CHECK(*granted < std::max(provisional_end, back) + 2s);  // once the offer lapsed, not after a stale threshold
}
