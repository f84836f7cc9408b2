// PostgresBackend against a real server: connection info in every form, the
// password never shown, the schema, each statement's semantics (as
// MemoryBackend defines them), the WAL a losing try writes, concurrent
// reclaimers, batched heartbeats, LISTEN/NOTIFY waits and a user's pool.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <latch>
#include <thread>

#include "dsn.hpp"  // the backend's own DSN defaults, tested directly below
#include "sql.hpp"  // the backend's statement names, tested directly below
#include "pgmutex/postgres_pool.hpp"
#include "support.hpp"

using namespace itest;
using pgmutex::AcquireRequest;
using pgmutex::Errc;
using pgmutex::HolderKey;
using pgmutex::LockRef;
using pgmutex::PostgresBackend;
using pgmutex::PostgresOptions;

namespace {

PostgresOptions quick_fail() {
  PostgresOptions o;
  o.reconnect_attempts = 1;
  o.connect_timeout = 2s;
  return o;
}

AcquireRequest request(const std::string& table, const std::string& lock, const std::string& instance,
                       std::chrono::nanoseconds stale = 60s) {
  return AcquireRequest{LockRef{table, lock}, instance, stale};
}

void require_connects(PostgresBackend& backend) {
  auto connected = backend.connect();
  INFO(backend.redacted_dsn() << ": " << (connected ? std::string("ok") : connected.error().message()));
  REQUIRE(connected);
  const std::string table = fresh_table("dsn");
  REQUIRE(backend.create_schema(table));
  auto won = backend.try_acquire(request(table, "job", "me"));
  REQUIRE(won);
  REQUIRE(won->acquired);
}

struct EnvVar {
  EnvVar(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~EnvVar() { ::unsetenv(name_); }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;
  const char* name_;
};

}  // namespace

TEST_CASE("every form of connection info reaches the server", "[backend][dsn]") {
  const Server s = server();
  SECTION("keyword form") {
    PostgresBackend b("host=" + s.socket_dir + " port=" + s.port + " dbname=" + s.database + " user=" + s.user);
    require_connects(b);
  }
  SECTION("URI form") {
    PostgresBackend b("postgresql://" + s.user + "@" + s.tcp_host + ":" + s.port + "/" + s.database);
    require_connects(b);
  }
  SECTION("empty and partial DSNs are filled from PGHOST, PGPORT, PGUSER, PGDATABASE") {
    PostgresBackend empty("");
    require_connects(empty);
    PostgresBackend partial("dbname=" + s.database);
    require_connects(partial);
  }
  SECTION("password in the keyword form") {
    PostgresBackend b("host=" + s.tcp_host + " port=" + s.port + " dbname=" + s.database + " user=" +
                      s.password_role + " password=" + s.password);
    require_connects(b);
    CHECK(b.redacted_dsn().find(s.password) == std::string::npos);
    CHECK(b.redacted_dsn().find("password=********") != std::string::npos);
  }
  SECTION("password in the URI form") {
    PostgresBackend b("postgresql://" + s.password_role + ":" + s.password + "@" + s.tcp_host + ":" + s.port + "/" +
                      s.database);
    require_connects(b);
    CHECK(b.redacted_dsn() ==
          "postgresql://" + s.password_role + ":********@" + s.tcp_host + ":" + s.port + "/" + s.database);
  }
  SECTION("password from PGPASSWORD") {
    EnvVar password("PGPASSWORD", s.password);
    PostgresBackend b("host=" + s.tcp_host + " user=" + s.password_role);
    require_connects(b);
  }
  SECTION("password from a .pgpass file") {
    char dir_template[] = "/tmp/pgmutex-pgpass.XXXXXX";
    REQUIRE(::mkdtemp(dir_template) != nullptr);
    const std::string file = std::string(dir_template) + "/pgpass";
    std::ofstream(file) << s.tcp_host << ":" << s.port << ":*:" << s.password_role << ":" << s.password << "\n";
    REQUIRE(::chmod(file.c_str(), 0600) == 0);
    {
      EnvVar passfile("PGPASSFILE", file);
      PostgresBackend b("host=" + s.tcp_host + " user=" + s.password_role);
      require_connects(b);
    }
    ::unlink(file.c_str());
    ::rmdir(dir_template);
  }
  SECTION("without the password the role cannot log in, and the error says so") {
    PostgresBackend b("host=" + s.tcp_host + " user=" + s.password_role, quick_fail());
    auto connected = b.connect();
    REQUIRE_FALSE(connected);
    CHECK(connected.error() == Errc::permission_denied);
    CHECK(connected.error().detail.find("password") != std::string::npos);
  }
}

TEST_CASE("the backend adds network timeouts to a DSN that does not set them", "[backend][dsn]") {
  using pgmutex::postgres_detail::with_network_timeout;
  const std::string keyword = with_network_timeout("host=db dbname=app", 10s);
  CHECK(keyword == "host=db dbname=app tcp_user_timeout=10000 keepalives_idle=5 keepalives_interval=2 keepalives_count=3");
  CHECK(with_network_timeout("", 4s) == "tcp_user_timeout=4000 keepalives_idle=2 keepalives_interval=1 keepalives_count=3");
  CHECK(with_network_timeout("postgresql://me@db/app", 10s) ==
        "postgresql://me@db/app?tcp_user_timeout=10000&keepalives_idle=5&keepalives_interval=2&keepalives_count=3");
  CHECK(with_network_timeout("postgresql://me@db/app?sslmode=require", 10s).starts_with(
      "postgresql://me@db/app?sslmode=require&tcp_user_timeout=10000&"));
  // What the DSN says wins; zero turns the defaults off.
  CHECK(with_network_timeout("host=db tcp_user_timeout=500 keepalives_count=9", 10s) ==
        "host=db tcp_user_timeout=500 keepalives_count=9 keepalives_idle=5 keepalives_interval=2");
  CHECK(with_network_timeout("host=db", 0s) == "host=db");
  // A password that merely contains a key's name does not count as setting it.
  CHECK(with_network_timeout("host=db password=xtcp_user_timeout=1", 10s).find(" tcp_user_timeout=10000") !=
        std::string::npos);
  CHECK(pgmutex::postgres_detail::with_connect_timeout("host=db connect_timeout = 7", 5s) ==
        "host=db connect_timeout = 7");

  // libpq takes them: a TCP connection with the defaults works.
  const Server s = server();
  PostgresBackend b("host=" + s.tcp_host + " port=" + s.port + " dbname=" + s.database + " user=" + s.user);
  require_connects(b);
}

TEST_CASE("a statement's name follows its text, so a pooled session's older statement never answers for it",
          "[backend][statements]") {
  using pgmutex::postgres_detail::Statement;
  const Statement a("pgmutex_acquire", "SELECT 1");
  CHECK(a.name.starts_with("pgmutex_acquire_"));
  CHECK(a.name == Statement("pgmutex_acquire", "SELECT 1").name);
  // A changed text, or a changed result (it is in the text), is a new name.
  CHECK(a.name != Statement("pgmutex_acquire", "SELECT 1, 2").name);
  // Postgres would cut a longer name to 63 bytes, where two could meet.
  CHECK_THROWS_AS(Statement(std::string(50, 'x'), "SELECT 1"), std::logic_error);
  // Every statement of a table, in both commit modes, is built (one over 63
  // bytes would throw); another table's texts, and so names, differ; the
  // modes share a statement's name only where they share its text.
  const auto sync = pgmutex::postgres_detail::make_statements("pgmutex_locks", false);
  const auto async = pgmutex::postgres_detail::make_statements("pgmutex_locks", true);
  const auto other = pgmutex::postgres_detail::make_statements("app.pgmutex_locks", false);
  CHECK(sync.acquire.name != other.acquire.name);
  CHECK(sync.acquire.name != sync.election_acquire.name);
  CHECK((sync.heartbeat.name == async.heartbeat.name) == (sync.heartbeat.sql == async.heartbeat.sql));
  CHECK((sync.acquire.name == async.acquire.name) == (sync.acquire.sql == async.acquire.sql));
  CHECK(sync.heartbeat_many_skip_locked.name.size() <= 63);
}

TEST_CASE("no error text and no redacted DSN ever contains the password", "[backend][dsn][secrets]") {
  const Server s = server();
  const std::string secret = "Sup3r-S3cret-Pw";
  const std::vector<std::string> dsns = {
      // Wrong password: authentication fails.
      "host=" + s.tcp_host + " port=" + s.port + " user=" + s.password_role + " password=" + secret,
      "host=" + s.tcp_host + " port=" + s.port + " user=" + s.password_role + " password='" + secret + "'",
      "postgresql://" + s.password_role + ":" + secret + "@" + s.tcp_host + ":" + s.port + "/" + s.database,
      "postgres://" + s.password_role + "@" + s.tcp_host + ":" + s.port + "/" + s.database + "?password=" + secret,
      // Nobody listens there.
      "host=127.0.0.1 port=1 user=x password=" + secret,
      "postgresql://x:" + secret + "@127.0.0.1:1/db",
      // A '?' in the password: libpq's user info runs to the first '@' before any '/'.
      "postgresql://x:" + secret + "?q@127.0.0.1:1/db",
      // Odd, but libpq parses it, then quotes the whole URI in its complaint.
      "postgresql://x:" + secret + " more@127.0.0.1:1/db",
      // Malformed: an option libpq does not know.
      "host=127.0.0.1 password=" + secret + " bogus_option=1",
  };
  for (const std::string& dsn : dsns) {
    INFO("dsn form: " << dsn.substr(0, 12));
    PostgresBackend b(dsn, quick_fail());
    CHECK(b.redacted_dsn().find(secret) == std::string::npos);
    CHECK(b.redacted_dsn().find("********") != std::string::npos);
    std::vector<pgmutex::Error> errors;
    if (auto r = b.connect(); !r) errors.push_back(r.error());
    if (auto r = b.create_schema("mutex_lock"); !r) errors.push_back(r.error());
    if (auto r = b.try_acquire(request("mutex_lock", "job", "me")); !r) errors.push_back(r.error());
    if (auto r = b.inspect(LockRef{"mutex_lock", "job"}); !r) errors.push_back(r.error());
    REQUIRE(errors.size() == 4);
    // A DSN libpq cannot parse is a usage error, reported at once; a refused
    // login is permission_denied, never retried; the others are outages.
    const bool malformed = dsn.find("bogus_option") != std::string::npos;
    const bool refused = dsn.find(s.password_role) != std::string::npos;
    for (const pgmutex::Error& e : errors) {
      INFO(e.message());
      CHECK(e == (malformed ? Errc::invalid_argument : refused ? Errc::permission_denied : Errc::backend_unavailable));
      CHECK(e.message().find(secret) == std::string::npos);
      CHECK(e.message().find(malformed ? "invalid connection string"
                             : refused ? "password authentication failed"
                                       : "cannot connect") != std::string::npos);
    }
  }
}

TEST_CASE("create_schema makes the table DESIGN.md shows, idempotently", "[backend][schema]") {
  const std::string table = fresh_table("schema");
  PostgresBackend b("");
  REQUIRE(b.create_schema(table));
  REQUIRE(b.create_schema(table));  // idempotent
  const auto columns = admin(
      "SELECT column_name, data_type, column_default FROM information_schema.columns WHERE table_name = '" + table +
      "' ORDER BY ordinal_position");
  REQUIRE(columns.size() == 11);
  CHECK(columns[0][0].as<std::string>() == "lock_name");
  CHECK(columns[5][0].as<std::string>() == "fence");
  CHECK(columns[5][1].as<std::string>() == "bigint");
  CHECK(columns[5][2].as<std::string>() == "nextval('" + table + "_fence_seq'::regclass)");
  // The grant's identity and its holder's threshold: nullable, so rows made by the seed's package fit.
  CHECK(columns[6][0].as<std::string>() == "grant_token");
  CHECK(columns[6][1].as<std::string>() == "bigint");
  CHECK(columns[6][2].is_null());
  CHECK(columns[7][0].as<std::string>() == "holder_stale_s");
  CHECK(columns[7][1].as<std::string>() == "double precision");
  // What status shows of the holder: nullable too.
  CHECK(columns[8][0].as<std::string>() == "holder_host");
  CHECK(columns[9][0].as<std::string>() == "holder_pid");
  CHECK(columns[9][1].as<std::string>() == "bigint");
  CHECK(columns[10][0].as<std::string>() == "holder_command");
  for (std::size_t c = 8; c < 11; ++c) CHECK(columns[c][2].is_null());
  const auto constraints =
      admin("SELECT conname, contype FROM pg_constraint WHERE conrelid = '" + table + "'::regclass ORDER BY conname");
  REQUIRE(constraints.size() == 2);
  CHECK(constraints[0][0].as<std::string>() == "chk_locked");  // the seed's name
  CHECK(constraints[1][0].as<std::string>() == "uq_" + table);
  // Room on each page for a heartbeat's new row version: a HOT update, no index entry.
  CHECK(admin("SELECT reloptions::text FROM pg_class WHERE oid = '" + table + "'::regclass")[0][0].as<std::string>() ==
        "{fillfactor=50}");

  SECTION("names read as psql reads them: quoted parts keep their case, unquoted ones fold to lower case") {
    admin("CREATE SCHEMA IF NOT EXISTS \"Locks\"");
    const std::string pid = std::to_string(::getpid());
    const std::string mixed = "\"Locks\".\"Mixed_" + pid + "\"";
    REQUIRE(b.create_schema(mixed));
    auto won = b.try_acquire(request(mixed, "job", "me"));
    REQUIRE(won);
    CHECK(won->acquired);
    CHECK(admin("SELECT count(*) FROM \"Locks\".\"Mixed_" + pid + "\"")[0][0].as<int>() == 1);
    // Unquoted, as in psql: Locks_Folded.Jobs is locks_folded.jobs.
    admin("CREATE SCHEMA IF NOT EXISTS locks_folded");
    const std::string folded = "Locks_Folded.Jobs_" + pid;
    REQUIRE(b.create_schema(folded));
    REQUIRE(b.try_acquire(request(folded, "job", "me")));
    CHECK(admin("SELECT count(*) FROM locks_folded.jobs_" + pid)[0][0].as<int>() == 1);
  }
  SECTION("injection attempts are rejected before any SQL is sent") {
    for (const std::string& bad : std::vector<std::string>{"mutex_lock; DROP TABLE mutex_lock", "mutex_lock\"; --", "a.b.c", "", "1abc",
                                  "x y", "tab'le", std::string(64, 'a')}) {
      INFO("table: " << bad);
      auto created = b.create_schema(bad);
      REQUIRE_FALSE(created);
      CHECK(created.error() == Errc::invalid_argument);
      CHECK(created.error().detail.find("identifier") != std::string::npos);
      auto tried = b.try_acquire(request(bad, "job", "me"));
      REQUIRE_FALSE(tried);
      CHECK(tried.error() == Errc::invalid_argument);
    }
  }
  SECTION("a missing table is named, with the fix") {
    auto tried = b.try_acquire(request(fresh_table("missing"), "job", "me"));
    REQUIRE_FALSE(tried);
    CHECK(tried.error() == Errc::schema_missing);
    CHECK(tried.error().detail.find("create_schema") != std::string::npos);
  }
}

TEST_CASE("create_schema upgrades a table made with the seed's exact DDL", "[backend][schema]") {
  const std::string seed_table = seed_made_table("seed");
  const std::string schema = seed_table.substr(0, seed_table.find('.'));
  admin("INSERT INTO " + schema + ".mutex_lock VALUES ('old-job', 1, 'seed-holder', now(), now())");
  const std::string table = schema + ".mutex_lock";

  PostgresBackend b("");
  auto before = b.try_acquire(request(table, "job", "me"));
  REQUIRE_FALSE(before);
  CHECK(before.error() == Errc::schema_missing);

  REQUIRE(b.create_schema(table));
  REQUIRE(b.create_schema(table));
  CHECK(admin("SELECT reloptions::text FROM pg_class WHERE oid = '" + table + "'::regclass")[0][0].as<std::string>() ==
        "{fillfactor=50}");
  // A fillfactor someone chose is kept.
  admin("ALTER TABLE " + table + " SET (fillfactor = 80)");
  REQUIRE(b.create_schema(table));
  CHECK(admin("SELECT reloptions::text FROM pg_class WHERE oid = '" + table + "'::regclass")[0][0].as<std::string>() ==
        "{fillfactor=80}");
  auto old = b.inspect(LockRef{table, "old-job"});
  REQUIRE(old);
  REQUIRE(old->has_value());
  CHECK((*old)->instance_id == "seed-holder");
  CHECK((*old)->fence > 0);
  auto won = b.try_acquire(request(table, "job", "me"));
  REQUIRE(won);
  CHECK(won->acquired);
  CHECK(won->fence > (*old)->fence);
}

TEST_CASE("each operation means what MemoryBackend says it means", "[backend][semantics]") {
  const std::string table = fresh_table("ops");
  PostgresBackend a("");
  PostgresBackend b("");
  REQUIRE(a.create_schema(table));
  const LockRef job{table, "job"};

  auto first = a.try_acquire(request(table, "job", "A"));
  REQUIRE(first);
  REQUIRE(first->acquired);
  CHECK_FALSE(first->reclaimed);
  CHECK(first->holder.empty());
  const auto f1 = first->fence;

  auto lost = b.try_acquire(request(table, "job", "B"));
  REQUIRE(lost);
  CHECK_FALSE(lost->acquired);
  CHECK(lost->holder == "A");
  CHECK(lost->fence == f1);
  CHECK(lost->holder_age_s >= 0.0);
  CHECK(lost->holder_age_s < 5.0);

  CHECK(a.heartbeat(HolderKey{job, "A", f1}));
  auto not_ours = b.heartbeat(HolderKey{job, "B", f1});
  REQUIRE_FALSE(not_ours);
  CHECK(not_ours.error() == Errc::lock_not_held);
  CHECK(a.heartbeat(HolderKey{job, "A", f1 + 1000}).error() == Errc::lock_not_held);

  auto row = b.inspect(job);
  REQUIRE(row);
  REQUIRE(row->has_value());
  CHECK((*row)->lock_name == "job");
  CHECK((*row)->instance_id == "A");
  CHECK((*row)->fence == f1);
  CHECK((*row)->seconds_since_heartbeat < 5.0);
  const auto skew = std::chrono::system_clock::now() - (*row)->acquired_at;
  CHECK(std::chrono::abs(skew) < 60s);

  REQUIRE(a.try_acquire(request(table, "another", "A")));
  auto rows = b.list(table);
  REQUIRE(rows);
  REQUIRE(rows->size() == 2);
  CHECK((*rows)[0].lock_name == "another");
  CHECK((*rows)[1].lock_name == "job");

  CHECK(b.release(HolderKey{job, "B", f1}).error() == Errc::lock_not_held);
  REQUIRE(a.release(HolderKey{job, "A", f1}));
  CHECK(a.release(HolderKey{job, "A", f1}).error() == Errc::lock_not_held);
  auto gone = b.inspect(job);
  REQUIRE(gone);
  CHECK_FALSE(gone->has_value());

  auto second = b.try_acquire(request(table, "job", "B", 50ms));
  REQUIRE(second);
  REQUIRE(second->acquired);
  CHECK(second->fence > f1);

  SECTION("a stale row is taken over with a fresh fence, naming the previous holder") {
    std::this_thread::sleep_for(150ms);
    auto taken = a.try_acquire(request(table, "job", "A", 50ms));
    REQUIRE(taken);
    CHECK(taken->acquired);
    CHECK(taken->reclaimed);
    CHECK(taken->holder == "B");
    CHECK(taken->holder_age_s >= 0.1);
    CHECK(taken->fence > second->fence);
    CHECK(b.heartbeat(HolderKey{job, "B", second->fence}).error() == Errc::lock_not_held);
    CHECK(a.heartbeat(HolderKey{job, "A", taken->fence}));
  }
  SECTION("force_release removes the row whoever holds it") {
    auto removed = a.force_release(job);
    REQUIRE(removed);
    REQUIRE(removed->has_value());
    CHECK((*removed)->instance_id == "B");
    auto again = a.force_release(job);
    REQUIRE(again);
    CHECK_FALSE(again->has_value());
    CHECK(b.heartbeat(HolderKey{job, "B", second->fence}).error() == Errc::lock_not_held);
  }
  SECTION("a lock name longer than the column is refused as an invalid argument") {
    auto too_long = a.try_acquire(request(table, std::string(65, 'x'), "A"));
    REQUIRE_FALSE(too_long);
    CHECK(too_long.error() == Errc::invalid_argument);
  }
}

TEST_CASE("a losing try writes no WAL; the seed's upsert does", "[backend][wal]") {
  const std::string table = fresh_table("wal");
  PostgresBackend holder("");
  PostgresBackend loser("");
  REQUIRE(holder.create_schema(table));
  REQUIRE(holder.try_acquire(request(table, "job", "holder")));
  REQUIRE(loser.inspect(LockRef{table, "job"}));  // connect and prepare outside the measurement

  // Background writers (checkpointer, autovacuum) could add WAL in the window: take the best of three.
  long long ours = -1;
  for (int round = 0; round < 3 && ours != 0; ++round) {
    ours = wal_bytes_during([&] {
      for (int i = 0; i < 200; ++i) {
        auto tried = loser.try_acquire(request(table, "job", "loser"));
        REQUIRE(tried);
        REQUIRE_FALSE(tried->acquired);
      }
    });
  }
  CHECK(ours == 0);

  // The seed's shape: INSERT … ON CONFLICT DO UPDATE … WHERE stale locks the row first.
  pqxx::connection c("");
  const long long seed = wal_bytes_during([&] {
    for (int i = 0; i < 20; ++i) {
      pqxx::nontransaction tx(c);
      tx.exec_params("INSERT INTO " + table +
                         " (lock_name, locked, instance_id, last_heartbeat, acquired_at) VALUES ($1, 1, $2, now(), now())"
                         " ON CONFLICT (locked, lock_name) DO UPDATE SET instance_id = EXCLUDED.instance_id,"
                         " last_heartbeat = now(), acquired_at = now()"
                         " WHERE " + table + ".last_heartbeat < now() - interval '600 seconds'",
                     "job", "seed-loser");
    }
  });
  CHECK(seed > 0);
}

TEST_CASE("of many concurrent reclaimers of one stale row, exactly one wins", "[backend][reclaim]") {
  const std::string table = fresh_table("reclaim");
  constexpr int reclaimers = 6;
  std::vector<PostgresBackend> backends;
  for (int i = 0; i < reclaimers; ++i) backends.emplace_back("");
  REQUIRE(backends[0].create_schema(table));
  for (auto& b : backends) REQUIRE(b.connect());

  for (int round = 0; round < 15; ++round) {
    INFO("round " << round);
    admin("DELETE FROM " + table);
    admin("INSERT INTO " + table +
          " (lock_name, instance_id, last_heartbeat, acquired_at) VALUES ('job', 'dead', now() - interval '1 hour', "
          "now() - interval '1 hour')");
    std::latch start(reclaimers);
    std::atomic<int> winners{0};
    std::atomic<int> errors{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < reclaimers; ++i) {
      threads.emplace_back([&, i] {
        start.arrive_and_wait();
        auto r = backends[static_cast<std::size_t>(i)].try_acquire(request(table, "job", "r" + std::to_string(i), 10s));
        if (!r) ++errors;
        else if (r->acquired) {
          CHECK(r->reclaimed);
          CHECK(r->holder == "dead");
          ++winners;
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(errors == 0);
    CHECK(winners == 1);
    CHECK(admin("SELECT count(*) FROM " + table)[0][0].as<int>() == 1);
  }
}

TEST_CASE("heartbeat_many beats every held key in one statement", "[backend][batch]") {
  const std::string t1 = fresh_table("batch");
  const std::string t2 = fresh_table("batch");
  PostgresBackend a("");
  PostgresBackend b("");
  REQUIRE(a.create_schema(t1));
  REQUIRE(a.create_schema(t2));
  std::vector<std::string> names;
  for (int i = 0; i < 300; ++i) names.push_back("lock \"" + std::to_string(i) + "\" \\ {x,y}");
  std::vector<HolderKey> keys;
  for (const std::string& name : names) {
    auto won = a.try_acquire(request(t1, name, "A"));
    REQUIRE(won);
    REQUIRE(won->acquired);
    keys.push_back(HolderKey{LockRef{t1, name}, "A", won->fence});
  }
  auto other = b.try_acquire(request(t2, "job", "B"));
  REQUIRE(other);
  keys.push_back(HolderKey{LockRef{t2, "job"}, "B", other->fence});        // held, other table
  keys.push_back(HolderKey{LockRef{t2, "job"}, "A", other->fence});        // not A's
  keys.push_back(HolderKey{LockRef{t1, names[0]}, "A", keys[0].fence + 99999});  // wrong fence
  keys.push_back(keys[1]);                                                 // a repeat: held too
  keys.push_back(keys[names.size() + 1]);                                  // a repeat: not held either
  admin("UPDATE " + t1 + " SET last_heartbeat = now() - interval '10 seconds'");

  auto held = a.heartbeat_many(keys);
  REQUIRE(held);
  REQUIRE(held->size() == keys.size());
  for (std::size_t i = 0; i < names.size(); ++i) CHECK((*held)[i]);
  CHECK((*held)[names.size()]);
  CHECK_FALSE((*held)[names.size() + 1]);
  CHECK_FALSE((*held)[names.size() + 2]);
  CHECK((*held)[names.size() + 3]);
  CHECK_FALSE((*held)[names.size() + 4]);
  CHECK(admin("SELECT max(now() - last_heartbeat) < interval '5 seconds' FROM " + t1)[0][0].as<bool>());
  auto none = a.heartbeat_many({});
  REQUIRE(none);
  CHECK(none->empty());
}

TEST_CASE("wait_for_release wakes on the release's NOTIFY, or times out", "[backend][notify]") {
  const std::string table = fresh_table("notify");
  PostgresBackend holder("");
  PostgresBackend waiter("");
  REQUIRE(holder.create_schema(table));
  auto won = holder.try_acquire(request(table, "job", "H"));
  REQUIRE(won);
  const LockRef job{table, "job"};

  const auto t0 = std::chrono::steady_clock::now();
  auto timed_out = waiter.wait_for_release(job, 200ms);
  REQUIRE(timed_out);
  CHECK_FALSE(*timed_out);
  CHECK(std::chrono::steady_clock::now() - t0 >= 190ms);

  std::thread releaser([&] {
    std::this_thread::sleep_for(200ms);
    REQUIRE(holder.release(HolderKey{job, "H", won->fence}));
  });
  const auto t1 = std::chrono::steady_clock::now();
  auto woke = waiter.wait_for_release(job, 10s);
  const auto waited = std::chrono::steady_clock::now() - t1;
  releaser.join();
  REQUIRE(woke);
  CHECK(*woke);
  CHECK(waited < 3s);
  auto channel = waiter.release_channel(job);
  REQUIRE(channel);
  CHECK(channel->starts_with("pgmutex_"));
}

namespace {
// A pool the way an application might have one: it opens its connections and
// closes them; the backend only borrows.
class SimplePool {
 public:
  explicit SimplePool(int size) {
    for (int i = 0; i < size; ++i) idle_.push_back(std::make_unique<pqxx::connection>(""));
    opened_ = size;
  }
  pqxx::connection& borrow() {
    std::lock_guard lock(mutex_);
    ++borrows_;
    if (idle_.empty()) throw std::runtime_error("pool exhausted");
    busy_.push_back(std::move(idle_.back()));
    idle_.pop_back();
    return *busy_.back();
  }
  void give_back(pqxx::connection& c) noexcept {
    std::lock_guard lock(mutex_);
    ++returns_;
    for (auto it = busy_.begin(); it != busy_.end(); ++it) {
      if (it->get() == &c) {
        idle_.push_back(std::move(*it));
        busy_.erase(it);
        return;
      }
    }
  }
  int borrows() const { std::lock_guard lock(mutex_); return borrows_; }
  int returns() const { std::lock_guard lock(mutex_); return returns_; }
  std::size_t busy() const { std::lock_guard lock(mutex_); return busy_.size(); }
  int opened() const { return opened_; }
  pqxx::connection& peek() { return *idle_.front(); }

 private:
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_, busy_;
  int borrows_ = 0, returns_ = 0, opened_ = 0;
};
static_assert(pgmutex::ConnectionPool<SimplePool>);
}  // namespace

TEST_CASE("a user's pool: one borrowed connection per operation, always given back", "[backend][pool]") {
  const std::string table = fresh_table("pool");
  SimplePool pool(1);
  {
    pgmutex::Mutex holder(pgmutex::make_pooled_backend(pool), options(table, "job", "pooled"));
    holder.create_schema();
    CHECK(pool.busy() == 0);
    auto guard = holder.try_acquire();
    REQUIRE(guard);
    CHECK(pool.busy() == 0);
    guard.heartbeat();
    CHECK(holder.inspect().has_value());

    pgmutex::Mutex other(PostgresBackend(""), options(table, "job", "direct"));
    auto refused = other.try_acquire();
    CHECK_FALSE(refused);
    guard.release();

    pgmutex::Mutex waiter(pgmutex::make_pooled_backend(pool), options(table, "job2", "pooled2"));
    pgmutex::Mutex blocker(PostgresBackend(""), options(table, "job2", "blocker"));
    auto held = blocker.try_acquire();
    REQUIRE(held);
    auto timed_out = waiter.acquire(std::chrono::nanoseconds(300ms));  // waits through LISTEN on a borrowed connection
    CHECK_FALSE(timed_out);
    CHECK(timed_out.why() == Errc::timeout);
  }
  CHECK(pool.borrows() == pool.returns());
  CHECK(pool.busy() == 0);
  CHECK(pool.opened() == 1);
  CHECK(pool.peek().is_open());
  pqxx::nontransaction tx(pool.peek());
  CHECK(tx.exec("SELECT count(*) FROM pg_listening_channels()")[0][0].as<int>() == 0);

  SECTION("a pool that cannot lend a connection makes the backend unavailable, not broken") {
    SimplePool empty(0);
    PostgresBackend b = pgmutex::make_pooled_backend(empty);
    auto r = b.try_acquire(request(table, "job", "x"));
    REQUIRE_FALSE(r);
    CHECK(r.error() == Errc::backend_unavailable);
    CHECK(r.error().detail.find("pool exhausted") != std::string::npos);
  }
}

TEST_CASE("the backend says whether its heartbeats commit asynchronously, as its options ask", "[backend][commit]") {
  static_assert(pgmutex::BackendReportsCommitMode<PostgresBackend>);
  PostgresOptions on;
  on.heartbeat_synchronous_commit_off = false;
  PostgresOptions off;
  off.heartbeat_synchronous_commit_off = true;
  CHECK_FALSE(PostgresBackend("", on).heartbeat_commits_asynchronously());
  CHECK(PostgresBackend("", off).heartbeat_commits_asynchronously());
  CHECK(PostgresBackend("").heartbeat_commits_asynchronously());  // the default: off, as documented
}

TEST_CASE("hand_over_at_close leaves the server session to whoever took the socket", "[backend][close]") {
  const std::string table = fresh_table("handover");
  const std::string app = "pgmutex_handover_" + std::to_string(::getpid());
  const auto ended = [&app] {
    for (int i = 0; i < 250 && !sessions_of(app).empty(); ++i) std::this_thread::sleep_for(20ms);
    return sessions_of(app).empty();
  };
  PostgresOptions options;
  int kept = -1;
  bool asked = false;
  SECTION("taken: the session outlives the backend, with no Terminate sent, and ends when the copy is closed") {
    options.hand_over_at_close = [&](int socket) {
      asked = true;
      kept = ::fcntl(socket, F_DUPFD_CLOEXEC, 0);
      return kept >= 0;
    };
    {
      PostgresBackend b("application_name=" + app, options);
      REQUIRE(b.create_schema(table));
      auto taken = b.try_acquire(request(table, "job", "me"));
      REQUIRE(taken);
      REQUIRE(taken->acquired);
      REQUIRE(b.release(HolderKey{LockRef{table, "job"}, "me", taken->fence}));
    }
    REQUIRE(asked);
    REQUIRE(kept >= 0);
    // Had libpq's Terminate gone out, the server process would have ended
    // by now; while we hold the socket, this one cannot.
    std::this_thread::sleep_for(200ms);
    CHECK(sessions_of(app).size() == 1);
    ::close(kept);
    CHECK(ended());
  }
  SECTION("declined: the session ends when the backend goes, as libpq ends it") {
    options.hand_over_at_close = [&](int) { return asked = true, false; };
    {
      PostgresBackend b("application_name=" + app, options);
      REQUIRE(b.create_schema(table));
    }
    CHECK(asked);
    CHECK(ended());
  }
  SECTION("never connected: nothing to hand over") {
    options.hand_over_at_close = [&](int) { return asked = true, true; };
    { PostgresBackend b("application_name=" + app, options); }
    CHECK_FALSE(asked);
  }
}

TEST_CASE("a refusal that retrying cannot fix is its own error, reported at once", "[backend][dsn][errors]") {
  SECTION("values libpq refuses before it tries a server: invalid_argument, naming the keyword") {
    for (const std::string dsn : {"sslmode=bogus", "port=x", "port=70000", "connect_timeout=soon", "port=1,2"}) {
      INFO(dsn);
      PostgresBackend b(dsn);
      auto connected = b.connect();
      REQUIRE_FALSE(connected);
      CHECK(connected.error() == Errc::invalid_argument);
      CHECK(connected.error().detail.find(dsn.substr(0, dsn.find('='))) != std::string::npos);
    }
    EnvVar mode("PGSSLMODE", "bogus");
    auto connected = PostgresBackend("").connect();
    REQUIRE_FALSE(connected);
    CHECK(connected.error() == Errc::invalid_argument);
  }
  SECTION("a database that does not exist: schema_missing") {
    auto connected = PostgresBackend("dbname=pgmutex_no_such_database").connect();
    REQUIRE_FALSE(connected);
    CHECK(connected.error() == Errc::schema_missing);
    CHECK(connected.error().detail.find("3D000") != std::string::npos);
  }
  SECTION("a role that does not exist: permission_denied") {
    auto connected = PostgresBackend("user=pgmutex_no_such_role").connect();
    REQUIRE_FALSE(connected);
    CHECK(connected.error() == Errc::permission_denied);
  }
  SECTION("a table the role may not read: permission_denied") {
    const std::string table = fresh_table("noperm");
    PostgresBackend owner("");
    REQUIRE(owner.create_schema(table));
    const std::string role = "pgmutex_noperm_" + std::to_string(::getpid());
    admin("CREATE ROLE " + role + " LOGIN");
    auto tried = PostgresBackend("user=" + role).try_acquire(request(table, "job", "me"));
    admin("DROP ROLE " + role);
    REQUIRE_FALSE(tried);
    CHECK(tried.error() == Errc::permission_denied);
    CHECK(tried.error().detail.find("42501") != std::string::npos);
  }
}

TEST_CASE("a grant records its holder's host, pid and command", "[backend][holder]") {
  const std::string table = fresh_table("holder");
  PostgresOptions options;
  options.holder_command = "backup.sh --full";
  PostgresBackend b("", options);
  REQUIRE(b.create_schema(table));
  REQUIRE(b.try_acquire(request(table, "defaults", "me")));
  auto row = b.inspect(LockRef{table, "defaults"});
  REQUIRE(row);
  REQUIRE(row->has_value());
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  CHECK((*row)->holder_host == host);
  CHECK((*row)->holder_pid == ::getpid());
  CHECK((*row)->holder_command == "backup.sh --full");

  // Literals: request() takes std::string, and a view of its temporary would dangle.
  AcquireRequest given{LockRef{table, "given"}, "me", 60s};
  given.holder_details = pgmutex::HolderDetails{"web-3", 4242, "sync"};
  REQUIRE(b.try_acquire(given));
  auto listed = b.list(table);
  REQUIRE(listed);
  REQUIRE(listed->size() == 2);
  CHECK((*listed)[1].lock_name == "given");
  CHECK((*listed)[1].holder_host == "web-3");
  CHECK((*listed)[1].holder_pid == 4242);
  CHECK((*listed)[1].holder_command == "sync");
}
