// Failover: a primary and a streaming standby (tests/tools/with-standby),
// the clients on the DSN "host=…,… port=P1,P2 target_session_attrs=read-write".
// While locks are held the primary is stopped (-m immediate) and the standby
// promoted; the holders reconnect to the new primary.
//   [async]  the standby stops receiving WAL first, then grants go on on the
//            primary: the new primary lacks them. The holder whose grant
//            vanished learns it lost the lease; a grant made before the cut
//            survives; fences granted afterwards exceed every earlier one,
//            though the bare sequence goes back.
//   [sync]   synchronous replication: the grant survives, the holder keeps
//            the lock across the failover, and even the bare sequence goes on.
// Each run fails over once: run one tag per server pair (meson does).
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "pgmutex/testing/recording_metrics.hpp"
#include "support.hpp"

using namespace itest;
using pgmutex::Errc;
using pgmutex::PostgresBackend;
using RecordingMutex = pgmutex::BasicMutex<PostgresBackend, pgmutex::SteadyClock, pgmutex::testing::RecordingMetrics>;

namespace {

struct Pair {
  std::string mode = need_env("PGMUTEX_TEST_REPLICATION");
  std::string primary_pgctl = need_env("PGMUTEX_TEST_PGCTL");
  std::string standby_pgctl = need_env("PGMUTEX_TEST_STANDBY_PGCTL");
  std::string standby_host = need_env("PGMUTEX_TEST_STANDBY_HOST");
  std::string standby_port = need_env("PGMUTEX_TEST_STANDBY_PORT");
  std::string dsn = need_env("PGMUTEX_TEST_FAILOVER_DSN");

  [[nodiscard]] std::string standby_dsn() const {
    return "host=" + standby_host + " port=" + standby_port + " dbname=pgmutex user=postgres";
  }
};

pqxx::result on(const std::string& dsn, const std::string& sql) {
  pqxx::connection c(dsn);
  pqxx::nontransaction tx(c);
  return tx.exec(sql);
}

// Polls `done` every 50 ms until it holds or `limit` passes; true if it held.
template <class F>
bool eventually(F done, std::chrono::milliseconds limit = 20s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

pgmutex::Options failover_options(const std::string& table, const std::string& lock, const std::string& instance) {
  auto o = options(table, lock, instance);
  o.heartbeat_interval = 300ms;
  o.alert_threshold = 10s;
  o.stale_threshold = 30s;  // lease 27 s: the switch takes a few seconds
  return o;
}

pgmutex::PostgresOptions quick_reconnects() {
  pgmutex::PostgresOptions po;
  po.reconnect_attempts = 2;
  po.reconnect_backoff = 50ms;
  po.connect_timeout = 2s;
  return po;
}

// The standby has replayed everything the primary wrote so far.
void wait_for_standby(const Pair& pair) {
  const std::string lsn = admin("SELECT pg_current_wal_lsn()::text")[0][0].as<std::string>();
  REQUIRE(eventually([&] {
    return on(pair.standby_dsn(), "SELECT pg_last_wal_replay_lsn() >= '" + lsn + "'::pg_lsn")[0][0].as<bool>();
  }));
}

// The standby stops receiving WAL: what the primary commits from now on is
// acknowledged there and missing on the standby.
void cut_replication(const Pair& pair) {
  on(pair.standby_dsn(), "ALTER SYSTEM SET primary_conninfo = ''");
  on(pair.standby_dsn(), "SELECT pg_reload_conf()");
  REQUIRE(eventually([] { return admin("SELECT count(*) FROM pg_stat_replication")[0][0].as<int>() == 0; }));
}

// The failover: the primary dies, then the standby is promoted.
void fail_over(const Pair& pair) {
  REQUIRE(std::system((pair.primary_pgctl + " -m immediate stop >/dev/null").c_str()) == 0);
  REQUIRE(std::system((pair.standby_pgctl + " promote >/dev/null").c_str()) == 0);
  REQUIRE(on(pair.standby_dsn(), "SELECT NOT pg_is_in_recovery()")[0][0].as<bool>());
}

std::int64_t sequence_value(const std::string& dsn, const std::string& table) {
  return on(dsn, "SELECT last_value FROM " + table + "_fence_seq")[0][0].as<std::int64_t>();
}

// `count` grants of `lock`, each released at once; the highest fence.
pgmutex::Fence churn(RecordingMutex& mutex, int count) {
  pgmutex::Fence highest = 0;
  for (int i = 0; i < count; ++i) {
    auto guard = mutex.try_acquire();
    REQUIRE(guard);
    CHECK(guard.fence() > highest);
    highest = guard.fence();
    guard.release();
  }
  return highest;
}

}  // namespace

TEST_CASE("server identity: system identifier and the timeline WAL is written on", "[failover][identity]") {
  const Pair pair;
  PostgresBackend probe(pair.dsn, quick_reconnects());
  REQUIRE(probe.connect());
  const std::string identity = probe.server_identity();
  const std::string sysid = admin("SELECT system_identifier::text FROM pg_control_system()")[0][0].as<std::string>();
  CHECK(identity == sysid + "/00000001");
  CHECK(probe.history() == 0);
}

TEST_CASE("a role that may not read pg_control_system(): identity unknown, every reconnect a new history",
          "[failover][identity]") {
  // Conservative: a backend that cannot tell whether the server is the same
  // one takes every new connection for a possible failover. Fences need no
  // such privilege (pg_walfile_name and pg_current_wal_lsn are PUBLIC).
  const Server s = server();
  const std::string app = "unknown_identity_" + std::to_string(::getpid());
  const std::string table = fresh_table("identity");
  admin("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC");
  struct Restore {
    ~Restore() { admin("GRANT EXECUTE ON FUNCTION pg_control_system() TO PUBLIC"); }
  } restore;
  PostgresBackend b("host=" + s.tcp_host + " port=" + s.port + " dbname=" + s.database + " user=" + s.password_role +
                        " password=" + s.password + " application_name=" + app,
                    quick_reconnects());
  REQUIRE(b.create_schema(table));
  CHECK(b.server_identity().empty());
  CHECK(b.history() == 0);
  auto won = b.try_acquire(pgmutex::AcquireRequest{pgmutex::LockRef{table, "job"}, "holder", 600s, 5, 5s});
  REQUIRE(won);
  REQUIRE(won->acquired);
  const pgmutex::HolderKey key{pgmutex::LockRef{table, "job"}, "holder", won->fence, 5, 5s};
  REQUIRE(b.heartbeat(key));
  CHECK(b.history() == 0);

  admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '" + app + "'");
  REQUIRE(eventually([&] {
    return admin("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app + "'")[0][0].as<int>() == 0;
  }));
  REQUIRE(b.heartbeat(key));  // on a fresh connection: a new history, as the server would not say who it is
  CHECK(b.history() == 1);
  REQUIRE(b.release(key));
}

TEST_CASE("asynchronous replication: a vanished grant is lost, a replicated one kept, fences go on rising",
          "[failover][async]") {
  const Pair pair;
  REQUIRE(pair.mode == "async");
  const std::string table = fresh_table("failover_async");

  pgmutex::testing::RecordingMetrics kept_metrics, lost_metrics;
  RecordingMutex kept(PostgresBackend(pair.dsn, quick_reconnects()), failover_options(table, "kept", "kept-holder"), {},
                      kept_metrics);
  RecordingMutex lost(PostgresBackend(pair.dsn, quick_reconnects()), failover_options(table, "vanishing", "lost-holder"),
                      {}, lost_metrics);
  RecordingMutex churner(PostgresBackend(pair.dsn, quick_reconnects()), failover_options(table, "churn", "churner"));
  PostgresBackend probe(pair.dsn, quick_reconnects());
  kept.create_schema();

  // Granted and replicated before the cut.
  auto kept_guard = kept.try_acquire();
  REQUIRE(kept_guard);
  const pgmutex::Fence kept_fence = kept_guard.fence();
  REQUIRE(probe.connect());
  const std::string identity_before = probe.server_identity();
  wait_for_standby(pair);
  const std::int64_t sequence_at_cut = sequence_value("", table);
  cut_replication(pair);

  // Granted on the primary only: 100 grants, then the holder's.
  const pgmutex::Fence churn_before = churn(churner, 100);
  auto lost_guard = lost.try_acquire();
  REQUIRE(lost_guard);
  const pgmutex::Fence lost_fence = lost_guard.fence();
  CHECK(lost_fence > churn_before);
  const std::int64_t sequence_before = sequence_value("", table);
  const pgmutex::Fence highest_before = std::max({kept_fence, churn_before, lost_fence});
  std::this_thread::sleep_for(1s);  // heartbeats acknowledged by the primary alone
  REQUIRE_FALSE(lost_guard.lost());
  REQUIRE_FALSE(kept_guard.lost());

  fail_over(pair);

  // The holder whose grant vanished learns it at its next heartbeat on the
  // new primary, through the heartbeat's own answer (no row): not the watchdog.
  REQUIRE(eventually([&] { return lost_guard.lost(); }));
  CHECK(lost_metrics.count("lost") == 1);
  const auto lost_events = lost_metrics.events("lost");
  REQUIRE_FALSE(lost_events.empty());
  CHECK_THAT(lost_events.front().other, Catch::Contains("row gone or granted to another holder"));
  CHECK_THROWS_AS(lost_guard.heartbeat(), pgmutex::LockNotHeldError);

  // The grant made before the cut is on the new primary: its holder keeps it.
  const auto kept_beats = kept_metrics.count("heartbeat_latency");
  REQUIRE(eventually([&] { return kept_metrics.count("heartbeat_latency") > kept_beats + 2; }));
  CHECK_FALSE(kept_guard.lost());
  kept_guard.heartbeat();
  CHECK(kept_metrics.count("lost") == 0);

  // The new primary: same cluster, a new timeline, a new history.
  REQUIRE(probe.inspect(pgmutex::LockRef{table, "kept"}));
  const std::string identity_after = probe.server_identity();
  CHECK(probe.history() == 1);
  CHECK(identity_after.substr(0, identity_after.find('/')) == identity_before.substr(0, identity_before.find('/')));
  CHECK(identity_before.ends_with("/00000001"));
  CHECK(identity_after.ends_with("/00000002"));

  // Fences granted now exceed every fence granted before, though the bare
  // sequence went back: the standby never saw the last nextval()s.
  RecordingMutex rival(PostgresBackend(pair.dsn, quick_reconnects()), failover_options(table, "vanishing", "rival"));
  auto rival_guard = rival.try_acquire();
  REQUIRE(rival_guard);
  const std::int64_t sequence_after = sequence_value(pair.dsn, table);
  std::printf("async failover: fences before %" PRId64 "..%" PRId64 " (sequence %" PRId64 " at the cut, %" PRId64
              " before the failover); first fence after %" PRId64 " (sequence %" PRId64 ")\n",
              kept_fence, highest_before, sequence_at_cut, sequence_before, rival_guard.fence(), sequence_after);
  CHECK(sequence_after <= sequence_before);  // the sequence alone would hand out old fences again
  CHECK(rival_guard.fence() > highest_before);
  const pgmutex::Fence churn_after = churn(churner, 20);
  CHECK(churn_after > rival_guard.fence());

  // The rival cannot take the lock the kept holder still holds.
  RecordingMutex other(PostgresBackend(pair.dsn, quick_reconnects()), failover_options(table, "kept", "other"));
  auto refused = other.try_acquire();
  CHECK_FALSE(refused);
  CHECK(refused.why() == Errc::lock_held);
  REQUIRE(refused.holder());
  CHECK(refused.holder()->instance_id == "kept-holder");
  CHECK(refused.holder()->fence == kept_fence);

  kept_guard.release();
  rival_guard.release();
  CHECK_FALSE(probe.inspect(pgmutex::LockRef{table, "kept"})->has_value());
}

TEST_CASE("synchronous replication: the grant survives, the holder keeps the lock across the failover",
          "[failover][sync]") {
  const Pair pair;
  REQUIRE(pair.mode == "sync");
  const std::string table = fresh_table("failover_sync");

  pgmutex::testing::RecordingMetrics metrics;
  RecordingMutex holder(PostgresBackend(pair.dsn, quick_reconnects()), failover_options(table, "job", "holder"), {},
                        metrics);
  RecordingMutex churner(PostgresBackend(pair.dsn, quick_reconnects()), failover_options(table, "churn", "churner"));
  PostgresBackend probe(pair.dsn, quick_reconnects());
  holder.create_schema();
  auto guard = holder.try_acquire();
  REQUIRE(guard);
  const pgmutex::Fence fence = guard.fence();
  const pgmutex::Fence churn_before = churn(churner, 50);
  const std::int64_t sequence_before = sequence_value("", table);
  REQUIRE(probe.connect());
  const std::string identity_before = probe.server_identity();
  REQUIRE(eventually([&] { return metrics.count("heartbeat_latency") >= 2; }));

  fail_over(pair);

  // Heartbeats resume on the new primary; the lease never lapsed.
  const auto beats = metrics.count("heartbeat_latency");
  REQUIRE(eventually([&] { return metrics.count("heartbeat_latency") > beats + 2; }));
  CHECK_FALSE(guard.lost());
  guard.heartbeat();
  CHECK(metrics.count("lost") == 0);
  std::printf("sync failover: %zu heartbeats failed during the switch\n", metrics.count("heartbeat_failed"));

  auto row = probe.inspect(pgmutex::LockRef{table, "job"});
  REQUIRE(row);
  REQUIRE(row->has_value());
  CHECK((*row)->instance_id == "holder");
  CHECK((*row)->fence == fence);
  CHECK((*row)->seconds_since_heartbeat < 30.0);  // not stale on the new primary
  CHECK(probe.history() == 1);
  CHECK(identity_before.ends_with("/00000001"));
  CHECK(probe.server_identity().ends_with("/00000002"));

  // A rival is refused; fences go on rising, and so does the bare sequence:
  // every acquire's commit waited for the standby, and the sequence's WAL
  // comes before it.
  RecordingMutex rival(PostgresBackend(pair.dsn, quick_reconnects()), failover_options(table, "job", "rival"));
  auto refused = rival.try_acquire();
  CHECK_FALSE(refused);
  CHECK(refused.why() == Errc::lock_held);
  const pgmutex::Fence churn_after = churn(churner, 5);
  const std::int64_t sequence_after = sequence_value(pair.dsn, table);
  std::printf("sync failover: fences before %" PRId64 "..%" PRId64 " (sequence %" PRId64 "); after up to %" PRId64
              " (sequence %" PRId64 ")\n",
              fence, churn_before, sequence_before, churn_after, sequence_after);
  CHECK(sequence_after > sequence_before);
  CHECK(churn_after > churn_before);

  guard.release();
  CHECK_FALSE(probe.inspect(pgmutex::LockRef{table, "job"})->has_value());
}
