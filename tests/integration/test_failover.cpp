// Failover: a primary and a streaming standby (tests/tools/with-standby),
// the clients on the DSN "host=…,… port=P1,P2 target_session_attrs=read-write".
// While locks are held the primary is stopped (-m immediate) and the standby
// promoted; the holders reconnect to the new primary.
//   [async]  the standby stops receiving WAL first, then grants go on on the
//            primary: the new primary lacks them. A rival that tries before
//            the vanished grant's holder heard of the loss is refused by the
//            failover grace; the holder then learns it lost the lease; a
//            grant made before the cut survives; after the grace the rival
//            gets the lock, and fences granted afterwards exceed every
//            earlier one, though the bare sequence goes back. An election
//            (issue 18): a leader whose grant vanished knows its term is
//            over (its own clock) before a rival leads; a leader whose
//            proclaim the standby lacked announces it again; observers
//            never see a term go back.
//   [sync]   synchronous replication: the grant survives, the holder keeps
//            the lock across the failover, and even the bare sequence goes
//            on. With failover_grace = 0 a free lock is granted at once; with
//            the default the grace applies there too. An election's leader
//            leads on, and leader() on the new primary reports it.
//   [multihost] no failover: the standby listed first, a DSN with
//            target_session_attrs=read-write lands on the primary (keyword
//            and URI form, a Mutex and a Session); without it, a write on the
//            standby is refused with a message that names the setting.
// Each run fails over once: run one tag per server pair (meson does), the
// tests that fail over none first (Catch2 runs them in declaration order).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <cstdlib>
#include <optional>
#include <thread>
#include <vector>

#include "pgmutex/session.hpp"
#include "pgmutex/testing/recording_metrics.hpp"
#include "support.hpp"

using namespace itest;
using pgmutex::Errc;
using pgmutex::PostgresBackend;
using RecordingMutex = pgmutex::BasicMutex<PostgresBackend, pgmutex::SteadyClock, pgmutex::testing::RecordingMetrics>;

namespace {

// A gate that stops a backend's heartbeats before they are sent, until
// opened again (at most 20 s).
struct Gate {
  std::mutex mutex;
  std::condition_variable changed;
  bool open = true;
  int waiting = 0;
  void set(bool value) {
    {
      std::lock_guard lock(mutex);
      open = value;
    }
    changed.notify_all();
  }
  void pass() {
    std::unique_lock lock(mutex);
    ++waiting;
    changed.notify_all();
    changed.wait_for(lock, 20s, [&] { return open; });
    --waiting;
  }
  // Whether a heartbeat waits at the closed gate within `limit`.
  bool caught(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, limit, [&] { return waiting > 0; });
  }
};

// PostgresBackend whose heartbeats pass a Gate first: while it is closed the
// holder sends no heartbeat (the statement is held inside the mutex's I/O
// lock, so no other heartbeat of it overtakes), and a test can act before
// the holder's next heartbeat reaches the server.
class GatedBackend {
 public:
  GatedBackend(PostgresBackend backend, std::shared_ptr<Gate> gate) : b_(std::move(backend)), gate_(std::move(gate)) {}
  pgmutex::Result<void> create_schema(std::string_view t) noexcept { return b_.create_schema(t); }
  pgmutex::Result<pgmutex::AcquireResult> try_acquire(const pgmutex::AcquireRequest& r) noexcept {
    return b_.try_acquire(r);
  }
  pgmutex::Result<void> heartbeat(const pgmutex::HolderKey& k) noexcept {
    gate_->pass();
    return b_.heartbeat(k);
  }
  pgmutex::Result<void> release(const pgmutex::HolderKey& k) noexcept { return b_.release(k); }
  pgmutex::Result<std::optional<pgmutex::LockRow>> inspect(pgmutex::LockRef l) noexcept { return b_.inspect(l); }
  pgmutex::Result<std::vector<pgmutex::LockRow>> list(std::string_view t) noexcept { return b_.list(t); }
  pgmutex::Result<std::optional<pgmutex::LockRow>> force_release(pgmutex::LockRef l) noexcept {
    return b_.force_release(l);
  }
  pgmutex::Result<pgmutex::LeaderRecord> leader(pgmutex::LockRef l, std::chrono::nanoseconds stale) noexcept {
    return b_.leader(l, stale);
  }
  pgmutex::Result<pgmutex::LeaderRecord> announce(const pgmutex::HolderKey& k, std::string_view value) noexcept {
    return b_.announce(k, value);
  }
  pgmutex::Result<pgmutex::LeaderRecord> vacate(const pgmutex::HolderKey& k) noexcept { return b_.vacate(k); }
  pgmutex::Result<pgmutex::AcquireResult> try_acquire(const pgmutex::AcquireRequest& r,
                                                      pgmutex::GrantAnnouncement& a) noexcept {
    return b_.try_acquire(r, a);
  }
  pgmutex::Result<void> release_vacating(const pgmutex::HolderKey& k) noexcept { return b_.release_vacating(k); }
  [[nodiscard]] std::uint64_t session() const noexcept { return b_.session(); }
  [[nodiscard]] std::uint64_t history() const noexcept { return b_.history(); }
  [[nodiscard]] bool heartbeat_commits_asynchronously() const noexcept { return b_.heartbeat_commits_asynchronously(); }

 private:
  PostgresBackend b_;
  std::shared_ptr<Gate> gate_;
};
static_assert(pgmutex::Backend<GatedBackend>);
using GatedMutex = pgmutex::BasicMutex<GatedBackend, pgmutex::SteadyClock, pgmutex::testing::RecordingMetrics>;
using GatedElection = pgmutex::BasicElection<GatedBackend>;

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

pgmutex::Options failover_options(const std::string& table, const std::string& lock, const std::string& instance) {
  auto o = options(table, lock, instance);
  o.heartbeat_interval = 300ms;
  o.alert_threshold = 10s;
  o.stale_threshold = 30s;  // lease 27 s: the switch takes a few seconds
  return o;
}

pgmutex::PostgresOptions quick_reconnects(std::optional<std::chrono::nanoseconds> failover_grace = std::nullopt) {
  pgmutex::PostgresOptions po;
  po.reconnect_attempts = 2;
  po.reconnect_backoff = 50ms;
  po.connect_timeout = 2s;
  po.failover_grace = failover_grace;
  return po;
}

// A short stale threshold, so that the failover grace (by default the
// longest stale threshold) is short: lease 5.4 s, more than a switch takes.
pgmutex::Options short_lease(const std::string& table, const std::string& lock, const std::string& instance) {
  auto o = failover_options(table, lock, instance);
  o.alert_threshold = 3s;
  o.stale_threshold = 6s;
  return o;
}

// One try, retried while the backend fails (a connection that saw the
// failover) within `limit`.
template <class Mutex>
auto try_until_answered(Mutex& mutex, std::chrono::milliseconds limit = 20s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    auto answer = mutex.try_acquire(pgmutex::nothrow);
    if (answer) return std::move(*answer);
    if (std::chrono::steady_clock::now() >= until) return mutex.try_acquire();  // throws what it says
    std::this_thread::sleep_for(100ms);
  }
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

// Nanoseconds on the steady clock, for an atomic.
long long stamp() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

// The next change within 5 s, taking errors as a reconnect does (the
// observer's connection saw the failover: it reads again on a new one).
pgmutex::LeaderChange next_change(pgmutex::Observer& o) {
  for (int i = 0; i < 20; ++i) {
    auto c = o.next(pgmutex::nothrow, 5s);
    if (!c) {
      UNSCOPED_INFO("try " << i << ": " << c.error().message());
      std::this_thread::sleep_for(100ms);
      continue;
    }
    REQUIRE(*c);
    return **c;
  }
  FAIL("no change within 20 tries");
  return {};
}

// Every change the observer reports until it has had nothing to report for
// a second (errors, from a connection that saw the failover, skipped).
std::vector<pgmutex::LeaderChange> changes_until_quiet(pgmutex::Observer& o) {
  std::vector<pgmutex::LeaderChange> out;
  for (int i = 0; i < 40; ++i) {
    auto c = o.next(pgmutex::nothrow, 1s);
    if (!c) {
      std::this_thread::sleep_for(100ms);
      continue;
    }
    if (!*c) break;
    out.push_back(std::move(**c));
  }
  return out;
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

TEST_CASE("a multi-host DSN whose first host is a standby: target_session_attrs=read-write lands on the primary",
          "[failover][multihost]") {
  const Pair pair;
  const Server s = server();
  const std::string table = fresh_table("multihost_standby");
  REQUIRE(PostgresBackend("").create_schema(table));
  wait_for_standby(pair);  // the table is on the standby too: only its read-only-ness can refuse
  REQUIRE(on(pair.standby_dsn(), "SELECT pg_is_in_recovery()")[0][0].as<bool>());
  const std::string standby_first = "host=" + s.tcp_host + "," + s.tcp_host + " port=" + pair.standby_port + "," +
                                    s.port + " dbname=" + s.database + " user=" + s.user;
  const std::string standby_first_uri = "postgresql://" + s.user + "@" + s.tcp_host + ":" + pair.standby_port + "," +
                                        s.tcp_host + ":" + s.port + "/" + s.database;
  const auto held_on_primary = [&](const std::string& lock) {
    return admin("SELECT count(*) FROM " + table + " WHERE lock_name = '" + lock + "'")[0][0].as<int>() == 1;
  };

  SECTION("a Mutex, keyword form") {
    pgmutex::Mutex mutex(PostgresBackend(standby_first + " target_session_attrs=read-write", quick_reconnects()),
                         options(table, "keyword", "multihost"));
    auto guard = mutex.try_acquire();
    REQUIRE(guard);
    CHECK(held_on_primary("keyword"));
    CHECK(guard.release(pgmutex::nothrow));
  }
  SECTION("a Mutex, URI form") {
    pgmutex::Mutex mutex(PostgresBackend(standby_first_uri + "?target_session_attrs=read-write", quick_reconnects()),
                         options(table, "uri", "multihost"));
    auto guard = mutex.try_acquire();
    REQUIRE(guard);
    CHECK(held_on_primary("uri"));
    CHECK(guard.release(pgmutex::nothrow));
  }
  SECTION("a Session") {
    pgmutex::SessionOptions so;
    so.postgres = quick_reconnects();
    auto session = pgmutex::Session::create(standby_first + " target_session_attrs=read-write", so);
    pgmutex::SessionMutex mutex(session->backend(), options(table, "session", "multihost"));
    auto guard = mutex.try_acquire();
    REQUIRE(guard);
    CHECK(held_on_primary("session"));
    CHECK(guard.release(pgmutex::nothrow));
  }
  SECTION("without target_session_attrs the standby is taken, and the refusal names the setting") {
    pgmutex::Mutex mutex(PostgresBackend(standby_first, quick_reconnects()), options(table, "any", "multihost"));
    auto refused = mutex.try_acquire(pgmutex::nothrow);
    REQUIRE_FALSE(refused);
    INFO(refused.error().message());
    CHECK(refused.error().message().find("target_session_attrs=read-write") != std::string::npos);
    // A standby in recovery is transient (a failover may be under way: a
    // proxy in front, or a demoted primary): a blocking acquire tries again
    // until its timeout, and then says the backend never answered.
    CHECK(refused.error() == pgmutex::Errc::backend_unavailable);
    auto waited = mutex.acquire(pgmutex::nothrow, 600ms);
    REQUIRE_FALSE(waited);
    CHECK(waited.error() == pgmutex::Errc::backend_unavailable);
    CHECK_FALSE(held_on_primary("any"));
  }
}

TEST_CASE("asynchronous replication: a vanished grant is lost, the failover grace keeps a rival out meanwhile, "
          "a replicated grant is kept, fences go on rising",
          "[failover][async][election]") {
  const Pair pair;
  REQUIRE(pair.mode == "async");
  const std::string table = fresh_table("failover_async");

  // Every instance has a 6 s stale threshold: the grace is 6 s.
  pgmutex::testing::RecordingMetrics kept_metrics, lost_metrics;
  const auto gate = std::make_shared<Gate>();
  RecordingMutex kept(PostgresBackend(pair.dsn, quick_reconnects()), short_lease(table, "kept", "kept-holder"), {},
                      kept_metrics);
  GatedMutex lost(GatedBackend(PostgresBackend(pair.dsn, quick_reconnects()), gate),
                  short_lease(table, "vanishing", "lost-holder"), {}, lost_metrics);
  RecordingMutex churner(PostgresBackend(pair.dsn, quick_reconnects()), short_lease(table, "churn", "churner"));
  PostgresBackend probe(pair.dsn, quick_reconnects());
  kept.create_schema();

  // The election, in a table of its own: a leader elected before the cut
  // (its grant and announcement replicated), and an observer of it.
  const std::string elections = fresh_table("failover_async_election");
  pgmutex::Election kept_election(PostgresBackend(pair.dsn, quick_reconnects()),
                                  short_lease(elections, "leader", "kept-leader"));
  kept_election.create_schema();
  auto kept_lead = kept_election.campaign("k:1", 5s);
  REQUIRE(kept_lead);
  const pgmutex::Fence kept_term = kept_lead.term();
  pgmutex::Observer kept_watch(PostgresBackend(pair.dsn, quick_reconnects()),
                               short_lease(elections, "leader", "kept-watcher"));
  CHECK(next_change(kept_watch).term == kept_term);

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

  // On the primary alone: the kept leader's proclaim, and a leader whose
  // grant will vanish (its heartbeats pass a gate of their own), observed.
  kept_lead.proclaim("k:2");
  CHECK(next_change(kept_watch).leader->value == "k:2");
  const auto vanishing_gate = std::make_shared<Gate>();
  GatedElection vanishing_election(GatedBackend(PostgresBackend(pair.dsn, quick_reconnects()), vanishing_gate),
                                   short_lease(elections, "vanishing", "vanishing-leader"));
  auto vanishing_lead = vanishing_election.campaign("v:1", 5s);
  REQUIRE(vanishing_lead);
  const pgmutex::Fence vanishing_term = vanishing_lead.term();
  std::atomic<long long> vanishing_lost_at{0};
  std::stop_callback on_vanishing_lost(vanishing_lead.stop_token(), [&] { vanishing_lost_at = stamp(); });
  pgmutex::Observer vanishing_watch(PostgresBackend(pair.dsn, quick_reconnects()),
                                    short_lease(elections, "vanishing", "vanishing-watcher"));
  CHECK(next_change(vanishing_watch).term == vanishing_term);
  std::this_thread::sleep_for(1s);  // heartbeats acknowledged by the primary alone
  REQUIRE_FALSE(lost_guard.lost());
  REQUIRE_FALSE(kept_guard.lost());

  // The vanished grant's holder sends no heartbeat until the rival has tried:
  // its next heartbeat waits at the gate, unsent.
  gate->set(false);
  REQUIRE(gate->caught(5000ms));
  // The vanishing leader hears nothing from now on, until a rival leads:
  // only its own clock can end its term.
  vanishing_gate->set(false);
  REQUIRE(vanishing_gate->caught(5000ms));
  const auto switch_start = std::chrono::steady_clock::now();
  fail_over(pair);

  // A rival campaigns for the vanished leader's election on the new
  // primary, where it looks free: it waits out the failover grace.
  pgmutex::Election rival_election(PostgresBackend(pair.dsn, quick_reconnects()),
                                   short_lease(elections, "vanishing", "rival-leader"));
  std::optional<pgmutex::Election::leadership_type> rival_lead;
  std::atomic<long long> rival_led_at{0};
  std::jthread rival_campaign([&] {
    auto won = rival_election.campaign(pgmutex::nothrow, "r:1", 30s);
    rival_led_at = stamp();
    if (won) rival_lead.emplace(std::move(*won));
    else UNSCOPED_INFO("the rival's campaign: " << won.error().message());
  });

  // The rival tries on the new primary, where the lock looks free, while the
  // holder still believes it holds it: refused, by the failover grace.
  RecordingMutex rival(PostgresBackend(pair.dsn, quick_reconnects()), short_lease(table, "vanishing", "rival"));
  auto refused_rival = try_until_answered(rival);
  const double since_switch = std::chrono::duration<double>(std::chrono::steady_clock::now() - switch_start).count();
  CHECK_FALSE(lost_guard.lost());  // still believes: without the grace, both would
  CHECK_FALSE(refused_rival);
  CHECK(refused_rival.why() == Errc::lock_held);
  REQUIRE(refused_rival.holder());
  CHECK(refused_rival.holder()->instance_id == pgmutex::failover_grace_holder);
  const double grace_left = refused_rival.holder()->failover_grace_left_s;
  CHECK(grace_left > 5.0);
  CHECK(grace_left <= 6.0);
  const auto grace_seen = std::chrono::steady_clock::now();
  gate->set(true);

  // Meanwhile another instance waits for a free lock through unnamed
  // statements (which poll instead of LISTEN): it polls every poll_interval
  // through the grace, not as fast as a lock seen free would make it.
  pgmutex::testing::RecordingMetrics polling_metrics;
  auto unnamed_options = quick_reconnects();
  unnamed_options.statement_mode = pgmutex::StatementMode::unnamed;
  auto polling_options = short_lease(table, "free", "polling");
  polling_options.poll_interval = 500ms;
  RecordingMutex polling(PostgresBackend(pair.dsn, unnamed_options), polling_options, {}, polling_metrics);
  std::optional<decltype(polling.try_acquire())> polling_guard;
  std::thread polling_thread([&] { polling_guard.emplace(polling.acquire(30s)); });

  // The holder whose grant vanished learns it at its next heartbeat on the
  // new primary, through the heartbeat's own answer (no row): not the watchdog.
  REQUIRE(eventually([&] { return lost_guard.lost(); }));
  const double lost_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - switch_start).count();
  CHECK(lost_metrics.count("lost") == 1);
  const auto lost_events = lost_metrics.events("lost");
  REQUIRE_FALSE(lost_events.empty());
  CHECK_THAT(lost_events.front().other, Catch::Contains("row gone or granted to another holder"));
  CHECK_THROWS_AS(lost_guard.heartbeat(), pgmutex::LockNotHeldError);

  // The grant made before the cut is on the new primary: its holder keeps
  // it, and a rival is told who holds it, grace or not.
  const auto kept_beats = kept_metrics.count("heartbeat_latency");
  REQUIRE(eventually([&] { return kept_metrics.count("heartbeat_latency") > kept_beats + 2; }));
  CHECK_FALSE(kept_guard.lost());
  kept_guard.heartbeat();
  CHECK(kept_metrics.count("lost") == 0);
  RecordingMutex other(PostgresBackend(pair.dsn, quick_reconnects()), short_lease(table, "kept", "other"));
  auto refused = other.try_acquire();
  CHECK_FALSE(refused);
  CHECK(refused.why() == Errc::lock_held);
  REQUIRE(refused.holder());
  CHECK(refused.holder()->instance_id == "kept-holder");
  CHECK(refused.holder()->fence == kept_fence);
  CHECK(refused.holder()->failover_grace_left_s == 0.0);

  // The new primary: same cluster, a new timeline, a new history.
  REQUIRE(probe.inspect(pgmutex::LockRef{table, "kept"}));
  const std::string identity_after = probe.server_identity();
  CHECK(probe.history() == 1);
  CHECK(identity_after.substr(0, identity_after.find('/')) == identity_before.substr(0, identity_before.find('/')));
  CHECK(identity_before.ends_with("/00000001"));
  CHECK(identity_after.ends_with("/00000002"));
  // The grace's marker row is in the table, but no lock shows it.
  CHECK(on(pair.dsn, "SELECT fence FROM " + table + " WHERE lock_name = ''")[0][0].as<int>() == 2);
  auto listed = probe.list(table);
  REQUIRE(listed);
  for (const auto& row : *listed) CHECK_FALSE(row.lock_name.empty());
  CHECK_FALSE(probe.inspect(pgmutex::LockRef{table, "vanishing"})->has_value());

  // A blocking acquire waits out the grace, then wins. Fences granted now
  // exceed every fence granted before, though the bare sequence went back:
  // the standby never saw the last nextval()s.
  auto rival_guard = rival.acquire(30s);
  REQUIRE(rival_guard);
  rival_campaign.join();  // the election's rival waited out the grace too
  vanishing_gate->set(true);

  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - grace_seen).count();
  CHECK(waited >= grace_left - 1.0);  // a generous bound: the grace is on the server's clock
  polling_thread.join();
  REQUIRE(polling_guard);
  CHECK(*polling_guard);
  const std::size_t polls = polling_metrics.count("contended");
  CHECK(polls < 30);  // 500 ms apart for about 6 s
  const std::int64_t sequence_after = sequence_value(pair.dsn, table);
  std::printf("async failover: an unnamed-statement waiter was refused %zu times during the grace\n", polls);
  std::printf("async failover: rival refused %.2f s after the switch began (grace %.2f s left); the lost holder "
              "learned it %.2f s after; the rival won %.2f s after the refusal\n",
              since_switch, grace_left, lost_after, waited);
  std::printf("async failover: fences before %" PRId64 "..%" PRId64 " (sequence %" PRId64 " at the cut, %" PRId64
              " before the failover); first fence after %" PRId64 " (sequence %" PRId64 ")\n",
              kept_fence, highest_before, sequence_at_cut, sequence_before, rival_guard.fence(), sequence_after);
  CHECK(sequence_after <= sequence_before);  // the sequence alone would hand out old fences again
  CHECK(rival_guard.fence() > highest_before);
  const pgmutex::Fence churn_after = churn(churner, 20);
  CHECK(churn_after > rival_guard.fence());

  // The election. The vanished leader knew its term was over (its own
  // clock: it heard nothing) before the rival led, with a higher term.
  REQUIRE(rival_lead);
  REQUIRE(*rival_lead);
  CHECK(vanishing_lost_at != 0);
  CHECK(vanishing_lost_at < rival_led_at);
  CHECK(vanishing_lead.lost());
  CHECK(rival_lead->term() > vanishing_term);
  std::printf("async failover: the vanished leader knew its term was over %.2f s before the rival led\n",
              static_cast<double>(rival_led_at - vanishing_lost_at) / 1e9);
  // Its observer, not reading meanwhile, finds another history: the
  // rival's term where the vanished one was, at the same count (reported
  // with a gap); never a term below the vanished one.
  const auto vanishing_seen = changes_until_quiet(vanishing_watch);
  REQUIRE_FALSE(vanishing_seen.empty());
  for (const auto& c : vanishing_seen) {
    CHECK(c.term >= vanishing_term);
    if (c.leader) CHECK(c.leader->instance_id == "rival-leader");
  }
  REQUIRE(vanishing_seen.back().leader);
  CHECK(vanishing_seen.back().term == rival_lead->term());
  // The kept leader leads on. The new primary had its grant and "k:1", not
  // its proclaim: it announced "k:2" again (review finding 1), so leader()
  // and its observer say so, in the same term.
  CHECK_FALSE(kept_lead.lost());
  std::optional<pgmutex::Leader> kept_now;
  CHECK(eventually([&] {
    auto read = kept_election.leader(pgmutex::nothrow);
    if (read && *read) kept_now = **read;
    return kept_now && kept_now->value == "k:2";
  }));
  REQUIRE(kept_now);
  CHECK(kept_now->term == kept_term);
  CHECK(kept_now->value == "k:2");
  std::string kept_view = "k:2";  // what the observer says leads: what it last reported
  for (const auto& c : changes_until_quiet(kept_watch)) {
    CHECK(c.term == kept_term);
    kept_view = c.leader ? c.leader->value : "";
  }
  CHECK(kept_view == "k:2");

  kept_guard.release();
  rival_guard.release();
  polling_guard->release();
  CHECK_FALSE(probe.inspect(pgmutex::LockRef{table, "kept"})->has_value());
}

TEST_CASE("synchronous replication: the grant survives, the holder keeps the lock across the failover",
          "[failover][sync][election]") {
  const Pair pair;
  REQUIRE(pair.mode == "sync");
  const std::string table = fresh_table("failover_sync");

  pgmutex::testing::RecordingMetrics metrics;
  RecordingMutex holder(PostgresBackend(pair.dsn, quick_reconnects()), failover_options(table, "job", "holder"), {},
                        metrics);
  // failover_grace = 0: no grace, as synchronous replication loses no grant.
  RecordingMutex churner(PostgresBackend(pair.dsn, quick_reconnects(0s)), failover_options(table, "churn", "churner"));
  PostgresBackend probe(pair.dsn, quick_reconnects());
  holder.create_schema();
  auto guard = holder.try_acquire();
  REQUIRE(guard);
  const pgmutex::Fence fence = guard.fence();
  // The election, in a table of its own: a leader and an observer of it.
  const std::string elections = fresh_table("failover_sync_election");
  pgmutex::Election election(PostgresBackend(pair.dsn, quick_reconnects()),
                             failover_options(elections, "leader", "leader"));
  election.create_schema();
  auto lead = election.campaign("s:1", 5s);
  REQUIRE(lead);
  pgmutex::Observer watch(PostgresBackend(pair.dsn, quick_reconnects()),
                          failover_options(elections, "leader", "watcher"));
  CHECK(next_change(watch).term == lead.term());
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

  // The leader leads on, the same term; leader() on the new primary (asked
  // at the standby's own address, and through the leader's DSN) reports it;
  // its observer hears its next proclaim, and never another term.
  CHECK_FALSE(lead.lost());
  auto on_new_primary = PostgresBackend(pair.standby_dsn(), quick_reconnects())
                            .leader(pgmutex::LockRef{elections, "leader"}, 30s);
  REQUIRE(on_new_primary);
  CHECK(on_new_primary->leading());
  CHECK(on_new_primary->term == lead.term());
  CHECK(on_new_primary->value == "s:1");
  CHECK(on_new_primary->instance_id == "leader");
  auto leads = election.leader();
  REQUIRE(leads);
  CHECK(leads->term == lead.term());
  lead.proclaim("s:2");
  const auto seen = changes_until_quiet(watch);
  REQUIRE_FALSE(seen.empty());
  for (const auto& c : seen) CHECK(c.term == lead.term());
  CHECK(seen.back().event == pgmutex::LeaderEvent::proclaimed);
  REQUIRE(seen.back().leader);
  CHECK(seen.back().leader->value == "s:2");
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

  // A rival is refused, with or without the failover grace: the holder's
  // row is there and names it.
  RecordingMutex rival0(PostgresBackend(pair.dsn, quick_reconnects(0s)), failover_options(table, "job", "rival0"));
  auto refused0 = try_until_answered(rival0);
  CHECK_FALSE(refused0);
  CHECK(refused0.why() == Errc::lock_held);
  REQUIRE(refused0.holder());
  CHECK(refused0.holder()->instance_id == "holder");
  CHECK(refused0.holder()->failover_grace_left_s == 0.0);
  RecordingMutex rival(PostgresBackend(pair.dsn, quick_reconnects()), failover_options(table, "job", "rival"));
  auto refused = try_until_answered(rival);
  CHECK_FALSE(refused);
  CHECK(refused.why() == Errc::lock_held);
  REQUIRE(refused.holder());
  CHECK(refused.holder()->instance_id == "holder");

  // A free lock: served at once with failover_grace = 0; with the default,
  // the grace (the 30 s stale threshold) applies.
  RecordingMutex free0(PostgresBackend(pair.dsn, quick_reconnects(0s)), failover_options(table, "free0", "free0"));
  auto served = free0.try_acquire();
  CHECK(served);
  RecordingMutex waiting(PostgresBackend(pair.dsn, quick_reconnects()), failover_options(table, "free", "waiting"));
  auto in_grace = waiting.try_acquire();
  CHECK_FALSE(in_grace);
  REQUIRE(in_grace.holder());
  CHECK(in_grace.holder()->instance_id == pgmutex::failover_grace_holder);
  CHECK(in_grace.holder()->failover_grace_left_s > 25.0);
  CHECK(in_grace.holder()->failover_grace_left_s <= 30.0);
  // The command says why it did not run: the grace, not a holder (exit 75).
  const char* tool = std::getenv("PGMUTEX_TEST_TOOL");
  REQUIRE(tool != nullptr);
  const std::string command = std::string(tool) + " run --lock free --dsn '" + pair.dsn + "' --table " + table +
                              " -- true 2>&1";
  std::string said;
  FILE* out = popen(command.c_str(), "r");
  REQUIRE(out != nullptr);
  for (char buffer[512]; std::fgets(buffer, sizeof buffer, out) != nullptr;) said += buffer;
  const int status = pclose(out);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 75);
  CHECK(said.find("failover grace") != std::string::npos);
  std::printf("sync failover: pgmutex run said: %s", said.c_str());
  // Unnamed statements (for a transaction pooler) carry the same rule.
  auto unnamed_options = quick_reconnects();
  unnamed_options.statement_mode = pgmutex::StatementMode::unnamed;
  RecordingMutex unnamed(PostgresBackend(pair.dsn, unnamed_options), failover_options(table, "free", "unnamed"));
  auto unnamed_refused = unnamed.try_acquire();
  CHECK_FALSE(unnamed_refused);
  REQUIRE(unnamed_refused.holder());
  CHECK(unnamed_refused.holder()->instance_id == pgmutex::failover_grace_holder);
  CHECK(unnamed_refused.holder()->failover_grace_left_s > 25.0);
  std::printf("sync failover: grace 0: a free lock granted at once (fence %" PRId64 "); default: refused, grace %.2f s left\n",
              served.fence(), in_grace.holder()->failover_grace_left_s);

  // Fences go on rising, and so does the bare sequence: every acquire's
  // commit waited for the standby, and the sequence's WAL comes before it.
  const pgmutex::Fence churn_after = churn(churner, 5);
  const std::int64_t sequence_after = sequence_value(pair.dsn, table);
  std::printf("sync failover: fences before %" PRId64 "..%" PRId64 " (sequence %" PRId64 "); after up to %" PRId64
              " (sequence %" PRId64 ")\n",
              fence, churn_before, sequence_before, churn_after, sequence_after);
  CHECK(sequence_after > sequence_before);
  CHECK(churn_after > churn_before);

  served.release();
  guard.release();
  CHECK_FALSE(probe.inspect(pgmutex::LockRef{table, "job"})->has_value());
}
