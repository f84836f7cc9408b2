// Deployments: a real pgbouncer (1.18) in front of the server, in session and
// in transaction pooling ([pgbouncer], run through tests/tools/with-pgbouncer
// once per mode), and a role with only the privileges the lock needs
// ([privilege], directly against the server).
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "pgmutex/mutex.hpp"
#include "pgmutex/postgres_pool.hpp"
#include "pgmutex/session.hpp"
#include "support.hpp"

using namespace itest;
using pgmutex::AcquireRequest;
using pgmutex::Errc;
using pgmutex::HolderKey;
using pgmutex::LockRef;
using pgmutex::Mutex;
using pgmutex::PostgresBackend;
using pgmutex::PostgresOptions;
using pgmutex::StatementMode;

namespace {

AcquireRequest request(const std::string& table, const std::string& lock, const std::string& instance,
                       std::chrono::nanoseconds stale = 60s) {
  return AcquireRequest{LockRef{table, lock}, instance, stale, 0x5eed, 10s};
}

HolderKey key(const std::string& table, const std::string& lock, const std::string& instance, pgmutex::Fence fence) {
  return HolderKey{LockRef{table, lock}, instance, fence, 0x5eed, 5s};
}

PostgresOptions in_mode(StatementMode mode) {
  PostgresOptions o;
  o.statement_mode = mode;
  return o;
}

const char* name_of(StatementMode mode) {
  switch (mode) {
    case StatementMode::automatic: return "automatic";
    case StatementMode::prepared: return "prepared";
    case StatementMode::unnamed: return "unnamed";
  }
  return "?";
}

// pgbouncer's address and mode, from tests/tools/with-pgbouncer.
struct Bouncer {
  std::string dsn = need_env("PGMUTEX_TEST_PGBOUNCER_DSN");
  std::string mode = need_env("PGMUTEX_TEST_PGBOUNCER_MODE");
  std::string database = need_env("PGMUTEX_TEST_PGBOUNCER_DB");

  // A statement straight to the server, on the database behind pgbouncer.
  pqxx::result direct(const std::string& sql) const {
    pqxx::connection c("dbname=" + database);
    pqxx::nontransaction tx(c);
    return tx.exec(sql);
  }
  // The server processes that pgbouncer opened (every other session on that database).
  [[nodiscard]] std::string server_pids() const {
    return direct("SELECT coalesce(string_agg(pid::text, ',' ORDER BY pid), '') FROM pg_stat_activity"
                  " WHERE datname = current_database() AND pid <> pg_backend_pid()")[0][0]
        .as<std::string>();
  }
};

// Every operation of the Backend contract, and a wait for release that ends
// by a release (another backend's) and one that times out. `b` and `other`
// reach the server the same way.
void every_operation(PostgresBackend& b, PostgresBackend& other, const std::string& table) {
  REQUIRE(b.create_schema(table));
  REQUIRE(b.create_schema(table));  // idempotent

  auto won = b.try_acquire(request(table, "job", "first"));
  REQUIRE(won);
  REQUIRE(won->acquired);
  auto lost = other.try_acquire(request(table, "job", "second"));
  REQUIRE(lost);
  CHECK_FALSE(lost->acquired);
  CHECK(lost->holder == "first");
  REQUIRE(b.heartbeat(key(table, "job", "first", won->fence)));
  CHECK(b.heartbeat(key(table, "job", "first", won->fence + 100)).error() == Errc::lock_not_held);

  auto beaten = b.heartbeat_many(std::vector<HolderKey>{key(table, "job", "first", won->fence),
                                                        key(table, "job", "nobody", won->fence)});
  REQUIRE(beaten);
  CHECK((*beaten == std::vector<bool>{true, false}));

  auto row = other.inspect(LockRef{table, "job"});  // what `status` reads
  REQUIRE(row);
  REQUIRE(row->has_value());
  CHECK((*row)->instance_id == "first");
  CHECK((*row)->fence == won->fence);
  auto rows = other.list(table);
  REQUIRE(rows);
  CHECK(rows->size() == 1);

  // Nobody releases: the wait ends at its timeout.
  auto timed_out = other.wait_for_release(LockRef{table, "job"}, 300ms);
  REQUIRE(timed_out);
  CHECK_FALSE(*timed_out);

  // Released while `other` waits (its timeout far away): the wait ends true.
  std::atomic<bool> released{false};
  std::thread releaser([&] {
    std::this_thread::sleep_for(200ms);
    released = b.release(key(table, "job", "first", won->fence)).has_value();
  });
  auto woke = other.wait_for_release(LockRef{table, "job"}, 60s);
  releaser.join();
  REQUIRE(woke);
  CHECK(*woke);
  CHECK(released);
  CHECK(b.release(key(table, "job", "first", won->fence)).error() == Errc::lock_not_held);

  auto next = other.try_acquire(request(table, "job", "second"));
  REQUIRE(next);
  REQUIRE(next->acquired);
  CHECK(next->fence > won->fence);
  auto forced = b.force_release(LockRef{table, "job"});  // `pgmutex release --force`
  REQUIRE(forced);
  REQUIRE(forced->has_value());
  CHECK((*forced)->instance_id == "second");
  auto gone = b.inspect(LockRef{table, "job"});
  REQUIRE(gone);
  CHECK_FALSE(gone->has_value());
}

// Through Mutex: a holder with automatic heartbeats, a waiter blocked in
// acquire() until the holder releases.
void through_mutex(const std::string& dsn, PostgresOptions backend_options, const std::string& table) {
  auto o = options(table, "mutexjob", "holder");
  o.heartbeat_interval = 100ms;
  o.stale_threshold = 60s;
  Mutex holder(PostgresBackend(dsn, backend_options), o);
  holder.create_schema();
  auto w = options(table, "mutexjob", "waiter");
  Mutex waiter(PostgresBackend(dsn, backend_options), w);
  auto guard = holder.acquire(std::chrono::nanoseconds(10s));
  REQUIRE(guard);
  const auto fence = guard.fence();
  guard.heartbeat();
  std::thread releaser([&] {
    std::this_thread::sleep_for(300ms);
    guard.release();
  });
  auto got = waiter.acquire(std::chrono::nanoseconds(60s));
  releaser.join();
  REQUIRE(got);
  CHECK(got.fence() > fence);
  CHECK_FALSE(guard.lost());
}

}  // namespace

// ---- pgbouncer ----------------------------------------------------------------

TEST_CASE("through pgbouncer, automatic mode finds the pooler and every operation works", "[pgbouncer]") {
  const Bouncer bouncer;
  const std::string table = fresh_table("pgb_auto");
  PostgresBackend b(bouncer.dsn);
  PostgresBackend other(bouncer.dsn);
  REQUIRE(b.connect());
  REQUIRE(other.connect());
  INFO("pool_mode=" << bouncer.mode);
  // pgbouncer answers the start-up with a key of its own, not the server's pid.
  CHECK(b.uses_unnamed_statements());
  CHECK_FALSE(b.heartbeat_commits_asynchronously());
  every_operation(b, other, table);
  through_mutex(bouncer.dsn, {}, table);

  // The same server straight, not through pgbouncer: prepared statements, LISTEN.
  PostgresBackend direct("dbname=" + bouncer.database);
  REQUIRE(direct.connect());
  CHECK_FALSE(direct.uses_unnamed_statements());
  CHECK(direct.heartbeat_commits_asynchronously());
}

TEST_CASE("through pgbouncer, unnamed statements work in either pool mode", "[pgbouncer]") {
  const Bouncer bouncer;
  INFO("pool_mode=" << bouncer.mode);
  const std::string table = fresh_table("pgb_unnamed");
  PostgresBackend b(bouncer.dsn, in_mode(StatementMode::unnamed));
  PostgresBackend other(bouncer.dsn, in_mode(StatementMode::unnamed));
  CHECK(b.uses_unnamed_statements());  // known before connecting
  CHECK_FALSE(b.heartbeat_commits_asynchronously());
  every_operation(b, other, table);
  through_mutex(bouncer.dsn, in_mode(StatementMode::unnamed), table);
}

TEST_CASE("through pgbouncer, unnamed statements carry their own statement_timeout and leave no setting behind",
          "[pgbouncer][timeouts]") {
  const Bouncer bouncer;
  INFO("pool_mode=" << bouncer.mode);
  const std::string table = fresh_table("pgb_slow");
  PostgresBackend b(bouncer.dsn, in_mode(StatementMode::unnamed));
  REQUIRE(b.create_schema(table));
  auto won = b.try_acquire(request(table, "job", "holder"));
  REQUIRE(won);
  REQUIRE(won->acquired);
  bouncer.direct("CREATE FUNCTION " + table + "_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "PERFORM pg_sleep(3); RETURN NEW; END $$");
  bouncer.direct("CREATE TRIGGER slow BEFORE UPDATE ON " + table + " FOR EACH ROW EXECUTE FUNCTION " + table +
                 "_slow()");
  // A 1 s heartbeat: the server cancels it at 3/4 of that (57014), before the client gives up.
  const HolderKey slow{LockRef{table, "job"}, "holder", won->fence, 0x5eed, 1s};
  auto beat = b.heartbeat(slow);
  REQUIRE_FALSE(beat);
  INFO(beat.error().message());
  CHECK(beat.error() == Errc::backend_unavailable);
  CHECK(beat.error().detail.find("57014") != std::string::npos);
  bouncer.direct("DROP TRIGGER slow ON " + table);
  CHECK(b.heartbeat(slow));
  // Nothing was set for a session: every server connection pgbouncer lends has the default.
  for (int i = 0; i < 3; ++i) {
    pqxx::connection c(bouncer.dsn);
    pqxx::nontransaction tx(c);
    CHECK(tx.exec("SHOW statement_timeout")[0][0].as<std::string>() == "0");
    CHECK(tx.exec("SHOW lock_timeout")[0][0].as<std::string>() == "0");
    CHECK(tx.exec("SHOW synchronous_commit")[0][0].as<std::string>() == "on");
  }
}

namespace {
// The smallest pool a user might have: one connection, lent to one backend.
struct OnePool {
  explicit OnePool(const std::string& dsn) : connection(dsn) {}
  pqxx::connection connection;
  pqxx::connection& borrow() { return connection; }
  void give_back(pqxx::connection&) noexcept {}
};
}  // namespace

TEST_CASE("through pgbouncer, a backend over the user's pool with unnamed statements works in either pool mode",
          "[pgbouncer][pool]") {
  const Bouncer bouncer;
  INFO("pool_mode=" << bouncer.mode);
  const std::string table = fresh_table("pgb_pool");
  OnePool pool_a(bouncer.dsn), pool_b(bouncer.dsn);
  PostgresBackend b = pgmutex::make_pooled_backend(pool_a, in_mode(StatementMode::unnamed));
  PostgresBackend other = pgmutex::make_pooled_backend(pool_b, in_mode(StatementMode::unnamed));
  CHECK(b.uses_unnamed_statements());
  CHECK_FALSE(b.heartbeat_commits_asynchronously());
  every_operation(b, other, table);
}

TEST_CASE("through pgbouncer, prepared statements: all works in session pooling; in transaction pooling the error "
          "names the option",
          "[pgbouncer]") {
  const Bouncer bouncer;
  INFO("pool_mode=" << bouncer.mode);
  const std::string table = fresh_table("pgb_prepared");
  {
    PostgresBackend setup(bouncer.dsn, in_mode(StatementMode::unnamed));
    REQUIRE(setup.create_schema(table));
  }
  PostgresBackend b(bouncer.dsn, in_mode(StatementMode::prepared));
  REQUIRE(b.connect());
  CHECK_FALSE(b.uses_unnamed_statements());
  if (bouncer.mode == "session") {
    // One server connection per client for the client's whole life: prepared
    // statements and LISTEN work as on a direct connection.
    PostgresBackend other(bouncer.dsn, in_mode(StatementMode::prepared));
    every_operation(b, other, table);
    through_mutex(bouncer.dsn, in_mode(StatementMode::prepared), table);
    return;
  }
  // Transaction pooling. Made certain, not left to luck: a client holds one
  // server connection in a transaction while `b` prepares on another; then
  // the first is freed and the second taken, so `b`'s next statement meets
  // the server connection where nothing was prepared.
  pqxx::connection first(bouncer.dsn);
  auto hold_first = std::make_unique<pqxx::work>(first);
  hold_first->exec("SELECT 1");
  auto seen = b.inspect(LockRef{table, "job"});  // prepared and run on the other server connection
  REQUIRE(seen);
  pqxx::connection second(bouncer.dsn);
  pqxx::work hold_second(second);
  hold_second.exec("SELECT 1");  // the only idle one: where `b` prepared
  hold_first->commit();
  hold_first.reset();
  auto refused = b.inspect(LockRef{table, "job"});
  hold_second.commit();
  REQUIRE_FALSE(refused);
  INFO(refused.error().message());
  CHECK(refused.error() == Errc::backend_error);
  CHECK_THAT(refused.error().message(), Catch::Contains("26000") && Catch::Contains("transaction pooling") &&
                                            Catch::Contains("StatementMode::unnamed") &&
                                            Catch::Contains("--statement-mode unnamed"));
}

// A lock held by a direct connection, in a table made through pgbouncer:
// waiters join its queue, the holder releases, and the order they were
// served in is kept.
struct PooledLine {
  const Bouncer& bouncer;
  std::string table;
  std::string straight = "dbname=" + bouncer.database;  // the server itself, the database behind pgbouncer
  PostgresBackend holder{straight};
  pgmutex::Fence fence = 0;
  std::mutex order_lock;
  std::vector<std::string> order;

  PooledLine(const Bouncer& b, const std::string& prefix) : bouncer(b), table(fresh_table(prefix)) {
    {
      PostgresBackend setup(bouncer.dsn, in_mode(StatementMode::unnamed));
      REQUIRE(setup.create_schema(table));
    }
    auto won = holder.try_acquire(request(table, "job", "holder"));
    REQUIRE(won);
    REQUIRE(won->acquired);
    fence = won->fence;
  }
  int queued() const { return bouncer.direct("SELECT count(*) FROM " + table + "_queue")[0][0].as<int>(); }
  void wait_until_queued(int n) const {
    for (int i = 0; i < 1000 && queued() < n; ++i) std::this_thread::sleep_for(10ms);
    REQUIRE(queued() == n);
  }
  // Acquires through `m` (30 s at most) and records `who` when served.
  template <class M>
  void serve(M& m, const std::string& who) {
    auto guard = m.acquire(std::chrono::nanoseconds(30s));
    if (!guard) return;
    {
      std::lock_guard l(order_lock);
      order.push_back(who);
    }
    guard.release();
  }
  // A direct waiter queued after `pooled` waited past the 5 s lease of its
  // place; then the release. Before the 2.5 s look, the lease lapsed, the
  // release counted the place dead and swept it, and served the direct one first.
  void direct_waiter_then_release(std::jthread& pooled) {
    wait_until_queued(1);
    std::this_thread::sleep_for(6s);
    std::jthread direct([this] {
      Mutex m(PostgresBackend(straight), options(table, "job", "direct"));
      serve(m, "direct");
    });
    wait_until_queued(2);
    REQUIRE(holder.release(key(table, "job", "holder", fence)));
    pooled.join();
    direct.join();
    CHECK(order == std::vector<std::string>{"pooled", "direct"});
  }
};

// Behind the pooler a place has no server pid: a lease keeps it, which its
// looks renew; the first waiter LISTENs, and waits longer than the lease.
TEST_CASE("through pgbouncer in session pooling, a LISTENing waiter with prepared statements keeps its place past "
          "its 5 s lease",
          "[pgbouncer]") {
  const Bouncer bouncer;
  if (bouncer.mode != "session") return;  // transaction pooling cannot LISTEN: its waiters look every second
  PooledLine line(bouncer, "pgb_lease");
  std::jthread pooled([&] {
    Mutex m(PostgresBackend(bouncer.dsn, in_mode(StatementMode::prepared)), options(line.table, "job", "pooled"));
    line.serve(m, "pooled");
  });
  line.direct_waiter_then_release(pooled);
}

TEST_CASE("through pgbouncer in session pooling, a Session's waiter with prepared statements keeps its place past "
          "its 5 s lease",
          "[pgbouncer]") {
  const Bouncer bouncer;
  if (bouncer.mode != "session") return;
  PooledLine line(bouncer, "pgb_session_lease");
  pgmutex::SessionOptions so;
  so.postgres = in_mode(StatementMode::prepared);
  auto session = pgmutex::Session::create(bouncer.dsn, so);
  std::jthread pooled([&] {
    pgmutex::SessionMutex m(session->backend(), options(line.table, "job", "pooled"));
    line.serve(m, "pooled");
  });
  line.direct_waiter_then_release(pooled);
}

TEST_CASE("through pgbouncer, a held lock survives its server connections being terminated; heartbeats there "
          "commit synchronously",
          "[pgbouncer][session]") {
  const Bouncer bouncer;
  INFO("pool_mode=" << bouncer.mode);
  const std::string table = fresh_table("pgb_turnover");
  PostgresBackend backend(bouncer.dsn);
  REQUIRE(backend.connect());
  // Behind a pooler, another server process may run each heartbeat, unseen by
  // the client: no heartbeat may count on a later one to vouch for it.
  CHECK_FALSE(backend.heartbeat_commits_asynchronously());
  auto o = options(table, "turnover", "holder");
  o.heartbeat_interval = 100ms;
  o.stale_threshold = 60s;
  Mutex holder(std::move(backend), o);
  holder.create_schema();
  auto guard = holder.acquire(std::chrono::nanoseconds(10s));
  REQUIRE(guard);
  const auto fence = guard.fence();

  for (int round = 0; round < 3; ++round) {
    // The holder's server process, as pg_stat_activity lists it: a moment
    // after a reconnect it may not be listed yet (1 run in 10 read none).
    std::string before = bouncer.server_pids();
    for (int i = 0; i < 200 && before.empty(); ++i) {
      std::this_thread::sleep_for(50ms);
      before = bouncer.server_pids();
    }
    REQUIRE_FALSE(before.empty());
    const std::string cut = bouncer.direct("SELECT now()::text")[0][0].as<std::string>();
    bouncer.direct("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                   " WHERE datname = current_database() AND pid <> pg_backend_pid()");
    // Heartbeats land again, on new server processes (a generous bound, not a timing claim).
    bool landed = false;
    for (int i = 0; i < 400 && !landed; ++i) {
      std::this_thread::sleep_for(50ms);
      landed = bouncer.direct("SELECT count(*) FROM " + table + " WHERE lock_name = 'turnover' AND fence = " +
                              std::to_string(fence) + " AND last_heartbeat > '" + cut + "'::timestamptz")[0][0]
                   .as<int>() == 1;
    }
    CHECK(landed);
    const std::string after = bouncer.server_pids();
    CHECK(after != before);
    CHECK_FALSE(guard.lost());
  }
  guard.heartbeat();
  CHECK(guard.fence() == fence);
  guard.release();
  CHECK_FALSE(guard.lost());
}

// ---- least privilege ------------------------------------------------------------

namespace {

// A login role with nothing granted; the server trusts local connections.
std::string fresh_role(std::string_view stem) {
  const std::string role = fresh_table(stem);
  admin("CREATE ROLE " + role + " LOGIN");
  return role;
}

// Only what the lock needs: SELECT, INSERT, UPDATE, DELETE on the table and its queue, USAGE on its sequence.
void grant_least(const std::string& table, const std::string& role) {
  admin("GRANT SELECT, INSERT, UPDATE, DELETE ON " + table + ", " + table + "_queue TO " + role);
  admin("GRANT USAGE ON SEQUENCE " + table + "_fence_seq TO " + role);
}

}  // namespace

TEST_CASE("a role with only SELECT, INSERT, UPDATE, DELETE on the table and USAGE on its sequence runs every lock "
          "operation",
          "[privilege]") {
  const std::string table = fresh_table("least");
  REQUIRE(PostgresBackend("").create_schema(table));
  const std::string role = fresh_role("least_role");
  grant_least(table, role);
  // Nothing more: no CREATE on the schema, no other table privilege.
  CHECK_FALSE(admin("SELECT has_schema_privilege('" + role + "', 'public', 'CREATE')")[0][0].as<bool>());
  CHECK(admin("SELECT string_agg(privilege_type, ',' ORDER BY privilege_type) FROM information_schema.role_table_grants"
              " WHERE grantee = '" + role + "' AND table_name = '" + table + "'")[0][0]
            .as<std::string>() == "DELETE,INSERT,SELECT,UPDATE");
  CHECK(admin("SELECT string_agg(privilege_type, ',' ORDER BY privilege_type) FROM information_schema.role_table_grants"
              " WHERE grantee = '" + role + "' AND table_name = '" + table + "_queue'")[0][0]
            .as<std::string>() == "DELETE,INSERT,SELECT,UPDATE");
  CHECK(admin("SELECT count(DISTINCT table_name) FROM information_schema.role_table_grants WHERE grantee = '" + role +
              "'")[0][0]
            .as<int>() == 2);

  const std::string dsn = "user=" + role;
  for (const StatementMode mode : {StatementMode::automatic, StatementMode::unnamed}) {
    INFO("statement mode " << name_of(mode));
    PostgresBackend b(dsn, in_mode(mode));
    PostgresBackend other(dsn, in_mode(mode));
    REQUIRE(b.connect());
    CHECK(b.release_channel(LockRef{table, "job"}));
    // Every operation but create_schema, which is the owner's.
    {
      auto won = b.try_acquire(request(table, "job", "first"));
      REQUIRE(won);
      REQUIRE(won->acquired);
      REQUIRE(b.heartbeat(key(table, "job", "first", won->fence)));
      auto many = b.heartbeat_many(std::vector<HolderKey>{key(table, "job", "first", won->fence)});
      REQUIRE(many);
      CHECK((*many)[0]);
      auto row = other.inspect(LockRef{table, "job"});
      REQUIRE(row);
      REQUIRE(row->has_value());
      CHECK((*row)->instance_id == "first");
      auto rows = other.list(table);
      REQUIRE(rows);
      CHECK(rows->size() == 1);
      std::atomic<bool> released{false};
      std::thread releaser([&] {
        std::this_thread::sleep_for(200ms);
        released = b.release(key(table, "job", "first", won->fence)).has_value();  // DELETE and pg_notify
      });
      auto woke = other.wait_for_release(LockRef{table, "job"}, 60s);  // LISTEN, or polling
      releaser.join();
      REQUIRE(woke);
      CHECK(*woke);
      CHECK(released);
      auto taken = other.try_acquire(request(table, "job", "second"));
      REQUIRE(taken);
      REQUIRE(taken->acquired);
      CHECK(taken->fence > won->fence);  // nextval on the sequence
      auto forced = b.force_release(LockRef{table, "job"});
      REQUIRE(forced);
      CHECK(forced->has_value());
    }
    // Through Mutex: automatic heartbeats, a waiter blocked until the release.
    const PostgresOptions least = in_mode(mode);
    {
      auto o = options(table, "mutexjob", "holder");
      o.heartbeat_interval = 100ms;
      o.stale_threshold = 60s;
      Mutex holder(PostgresBackend(dsn, least), o);
      Mutex waiter(PostgresBackend(dsn, least), options(table, "mutexjob", "waiter"));
      auto guard = holder.acquire(std::chrono::nanoseconds(10s));
      REQUIRE(guard);
      guard.heartbeat();
      std::thread releaser([&] {
        std::this_thread::sleep_for(300ms);
        guard.release();
      });
      auto got = waiter.acquire(std::chrono::nanoseconds(60s));
      releaser.join();
      REQUIRE(got);
      CHECK(got.fence() > guard.fence());
    }
  }
}

TEST_CASE("create_schema without CREATE on the schema names the missing privilege and the GRANT to run",
          "[privilege]") {
  const std::string role = fresh_role("nocreate");
  PostgresBackend b("user=" + role);

  const std::string table = fresh_table("nocreate_t");
  auto refused = b.create_schema(table);
  REQUIRE_FALSE(refused);
  INFO(refused.error().message());
  CHECK(refused.error() == Errc::permission_denied);
  CHECK_THAT(refused.error().message(),
             Catch::Contains("42501") && Catch::Contains("role " + role + " lacks CREATE on schema public") &&
                 Catch::Contains("GRANT CREATE ON SCHEMA public TO " + role + ";") &&
                 Catch::Contains("have an owner run create_schema() (pgmutex schema)"));

  // A schema of its own, with a name that needs quoting: USAGE, no CREATE.
  const std::string schema = "Locks_" + fresh_table("s");
  admin("CREATE SCHEMA \"" + schema + "\"");
  admin("GRANT USAGE ON SCHEMA \"" + schema + "\" TO " + role);
  auto in_schema = b.create_schema("\"" + schema + "\".jobs");  // quoted, as psql needs it too
  REQUIRE_FALSE(in_schema);
  INFO(in_schema.error().message());
  CHECK(in_schema.error() == Errc::permission_denied);
  CHECK_THAT(in_schema.error().message(),
             Catch::Contains("GRANT CREATE ON SCHEMA \"" + schema + "\" TO " + role + ";"));

  // The GRANT it names is the fix.
  admin("GRANT CREATE ON SCHEMA public TO " + role);
  CHECK(b.create_schema(table));
  CHECK(b.try_acquire(request(table, "job", "me")));

  // An owner's up-to-date table without the fillfactor (made before it): a
  // non-owner's create_schema still succeeds, and leaves the table as it is.
  const std::string older = fresh_table("nocreate_old");
  REQUIRE(PostgresBackend("").create_schema(older));
  admin("ALTER TABLE " + older + " RESET (fillfactor)");
  CHECK(b.create_schema(older));
  CHECK(admin("SELECT coalesce(array_length(reloptions, 1), 0) FROM pg_class WHERE oid = '" + older + "'::regclass")[0][0]
            .as<int>() == 0);
}

TEST_CASE("a role that lacks a privilege on the table or its sequence is told which and the GRANT", "[privilege]") {
  const std::string table = fresh_table("lacking");
  REQUIRE(PostgresBackend("").create_schema(table));
  const std::string role = fresh_role("lacking_role");
  const std::string grants = "GRANT SELECT, INSERT, UPDATE, DELETE ON " + table + ", " + table + "_queue TO " + role +
                             "; GRANT USAGE ON SEQUENCE " + table + "_fence_seq TO " + role;
  PostgresBackend b("user=" + role);

  auto none = b.try_acquire(request(table, "job", "me"));
  REQUIRE_FALSE(none);
  INFO(none.error().message());
  CHECK(none.error() == Errc::permission_denied);
  CHECK_THAT(none.error().message(), Catch::Contains("permission denied for table " + table) &&
                                         Catch::Contains(grants));
  // A read (status, a monitoring role) needs SELECT alone, and is told so.
  auto status = b.list(table);
  REQUIRE_FALSE(status);
  CHECK(status.error() == Errc::permission_denied);
  CHECK_THAT(status.error().message(), Catch::Contains("run: GRANT SELECT ON " + table + ", " + table + "_queue TO " + role +
                                                       " (holding locks needs INSERT, UPDATE, DELETE too"));

  // The table, not its queue: every try reads the queue, and is refused.
  admin("GRANT SELECT, INSERT, UPDATE, DELETE ON " + table + " TO " + role);
  auto no_queue = b.try_acquire(request(table, "job", "me"));
  REQUIRE_FALSE(no_queue);
  INFO(no_queue.error().message());
  CHECK(no_queue.error() == Errc::permission_denied);
  CHECK_THAT(no_queue.error().message(),
             Catch::Contains("permission denied for table " + table + "_queue") && Catch::Contains(grants));

  // The table and its queue, not the sequence: a grant (an insert) draws a fence and is refused.
  admin("GRANT SELECT, INSERT, UPDATE, DELETE ON " + table + "_queue TO " + role);
  auto no_sequence = b.try_acquire(request(table, "job", "me"));
  REQUIRE_FALSE(no_sequence);
  INFO(no_sequence.error().message());
  CHECK(no_sequence.error() == Errc::permission_denied);
  CHECK_THAT(no_sequence.error().message(),
             Catch::Contains("permission denied for sequence " + table + "_fence_seq") && Catch::Contains(grants));
  CHECK(b.list(table));  // reading needs no more

  admin("GRANT USAGE ON SEQUENCE " + table + "_fence_seq TO " + role);
  auto won = b.try_acquire(request(table, "job", "me"));
  REQUIRE(won);
  CHECK(won->acquired);
}

TEST_CASE("a role granted only the lock may run locks; a campaign it may not run names the elections table's GRANT",
          "[privilege][election]") {
  const std::string table = fresh_table("least_election");
  REQUIRE(PostgresBackend("").create_schema(table));
  const std::string role = fresh_role("least_elect_role");
  grant_least(table, role);
  pgmutex::Options o = options(table, "primary", "a");
  pgmutex::Election election(PostgresBackend("user=" + role), o);
  auto refused = election.campaign(pgmutex::nothrow, "10.0.0.1:80", 5s);
  REQUIRE_FALSE(refused);
  INFO(refused.error().message());
  CHECK(refused.error() == Errc::permission_denied);
  const std::string grant = "GRANT SELECT, INSERT, UPDATE ON " + table + "_election TO " + role;
  CHECK_THAT(refused.error().message(), Catch::Contains(grant));
  // The campaign's refused announce left nothing behind: the lock is free again.
  CHECK(admin("SELECT count(*) FROM " + table)[0][0].as<int>() == 0);

  admin(grant);
  auto lead = election.campaign("10.0.0.1:80", 5s);
  REQUIRE(lead);
  CHECK(election.leader()->value == "10.0.0.1:80");
}

// Review finding 8: create_schema moves the fence sequence past the terms an
// election table kept, which takes UPDATE on the sequence. A role that may
// create in the schema but not setval is refused, told why and what to run,
// rather than left to campaigns that are each refused.
TEST_CASE("create_schema by a role that may not move a reset fence sequence says so and what to run",
          "[privilege][election]") {
  const std::string schema = fresh_table("reset_s");
  admin("CREATE SCHEMA " + schema);
  const std::string table = schema + ".locks";
  REQUIRE(PostgresBackend("").create_schema(table));
  {
    pgmutex::Election owner(PostgresBackend(""), options(table, "primary", "owner"));
    owner.campaign("first", 5s).resign();
  }
  admin("UPDATE " + table + "_election SET term = term + 1000");  // as a reset of the sequence leaves it
  const std::string role = fresh_role("reset_role");
  admin("GRANT USAGE, CREATE ON SCHEMA " + schema + " TO " + role);
  grant_least(table, role);
  admin("GRANT SELECT, INSERT, UPDATE ON " + table + "_election TO " + role);

  auto refused = PostgresBackend("user=" + role).create_schema(table);
  REQUIRE_FALSE(refused);
  INFO(refused.error().message());
  CHECK_THAT(refused.error().message(),
             Catch::Contains("records terms above the fences its sequence") &&
                 Catch::Contains("have the owner of the sequence run create_schema() (pgmutex schema), or run: SELECT "
                                 "setval("));

  REQUIRE(PostgresBackend("").create_schema(table));  // the owner's moves it
  REQUIRE(PostgresBackend("user=" + role).create_schema(table));  // and then there is nothing to move
  pgmutex::Election election(PostgresBackend("user=" + role), options(table, "primary", "a"));
  auto lead = election.campaign("after", 5s);
  REQUIRE(lead);
  CHECK(election.leader()->value == "after");
}
