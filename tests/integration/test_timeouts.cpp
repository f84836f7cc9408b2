// Every operation has a bound: a heartbeat or release stuck behind another
// session's row lock, a statement the server runs too long, and a server that
// froze (TCP open, nothing answered) all end in an error within the
// operation's timeout instead of blocking. Timings are not asserted tightly
// (these machines are noisy): a watchdog fails the test instead of hanging it.
// [multihost]: a multi-host DSN whose first host froze gives each host its
// own share of the connect budget, so the second serves. [prepare]: a Parse
// the server stored but answered with its statement timeout is not prepared
// twice.
#include <cstdlib>
#include <future>
#include <optional>
#include <thread>

#include "fault_proxy.hpp"
#include "host_attempts.hpp"
#include "pgmutex/postgres_pool.hpp"
#include "pgmutex/session.hpp"
#include "support.hpp"

using namespace itest;
using pgmutex::AcquireRequest;
using pgmutex::Errc;
using pgmutex::HolderKey;
using pgmutex::LockRef;
using pgmutex::PostgresBackend;
using pgmutex::PostgresOptions;

namespace {

// Generous: ten times the longest timeout used here.
constexpr auto watchdog = 10s;

// Runs `operation` on a thread. If it has not returned within `watchdog`, the
// test fails, `unblock` is called (so the thread can end) and the result is
// still waited for: the test never hangs on a blocked operation for long.
template <class Operation, class Unblock>
auto bounded(Operation operation, Unblock unblock) {
  auto future = std::async(std::launch::async, std::move(operation));
  const auto started = std::chrono::steady_clock::now();
  const bool on_time = future.wait_for(watchdog) == std::future_status::ready;
  if (!on_time) unblock();
  auto result = future.get();
  INFO("took " << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s");
  CHECK(on_time);
  return result;
}

// The table made directly, and a backend that reaches the server through
// `proxy`, with one reconnect per operation.
PostgresBackend backend_through(const FaultProxy& proxy, const std::string& table) {
  REQUIRE(PostgresBackend("").create_schema(table));
  PostgresOptions po;
  po.reconnect_attempts = 1;
  return PostgresBackend(proxy.dsn(), po);
}

AcquireRequest request(const std::string& table, const std::string& lock, pgmutex::GrantToken token) {
  return AcquireRequest{LockRef{table, lock}, "holder", 60s, token, 5s};
}

}  // namespace

TEST_CASE("a heartbeat or release behind another session's row lock fails with backend_unavailable, then succeeds",
          "[timeouts][rowlock]") {
  const std::string table = fresh_table("rowlock");
  PostgresBackend b("");
  REQUIRE(b.create_schema(table));
  auto won = b.try_acquire(request(table, "job", 11));
  REQUIRE(won);
  REQUIRE(won->acquired);
  const HolderKey key{LockRef{table, "job"}, "holder", won->fence, 11, 500ms};

  pqxx::connection other("");
  auto blocker = std::make_unique<pqxx::work>(other);
  blocker->exec("SELECT 1 FROM " + table + " WHERE lock_name = 'job' FOR UPDATE");
  const auto unblock = [&] { blocker->abort(); };

  auto beat = bounded([&] { return b.heartbeat(key); }, unblock);
  REQUIRE_FALSE(beat);
  INFO(beat.error().message());
  CHECK(beat.error() == Errc::backend_unavailable);
  // The server's lock_timeout, set inside the statement, ended the wait: not the client giving up.
  CHECK(beat.error().detail.find("55P03") != std::string::npos);

  auto released = bounded([&] { return b.release(key); }, unblock);
  REQUIRE_FALSE(released);
  INFO(released.error().message());
  // Refused by the server, so surely not applied: not outcome_unknown.
  CHECK(released.error() == Errc::backend_unavailable);

  blocker->abort();
  CHECK(b.heartbeat(key));  // retryable: the same connection, the same grant
  CHECK(b.release(key));
}

namespace {
// The smallest pool: one connection, lent to one borrower at a time.
struct OneConnectionPool {
  pqxx::connection connection{""};
  pqxx::connection& borrow() { return connection; }
  void give_back(pqxx::connection&) noexcept {}
};
}  // namespace

TEST_CASE("a borrowed pool connection gets the server-side lock_timeout too", "[timeouts][rowlock][pool]") {
  const std::string table = fresh_table("poollock");
  OneConnectionPool pool;
  PostgresBackend b = pgmutex::make_pooled_backend(pool);
  REQUIRE(b.create_schema(table));
  auto won = b.try_acquire(request(table, "job", 21));
  REQUIRE(won);
  REQUIRE(won->acquired);
  const HolderKey key{LockRef{table, "job"}, "holder", won->fence, 21, 500ms};

  pqxx::connection other("");
  auto blocker = std::make_unique<pqxx::work>(other);
  blocker->exec("SELECT 1 FROM " + table + " WHERE lock_name = 'job' FOR UPDATE");
  auto beat = bounded([&] { return b.heartbeat(key); }, [&] { blocker->abort(); });
  REQUIRE_FALSE(beat);
  INFO(beat.error().message());
  CHECK(beat.error() == Errc::backend_unavailable);
  CHECK(beat.error().detail.find("55P03") != std::string::npos);
  blocker->abort();
  CHECK(b.heartbeat(key));
  // The setting was transaction-local: nothing stays on the user's connection.
  pqxx::nontransaction tx(pool.connection);
  CHECK(tx.exec("SHOW lock_timeout")[0][0].as<std::string>() == "0");
}

TEST_CASE("a statement that runs past its timeout is cancelled by the server's statement_timeout",
          "[timeouts][statement]") {
  const std::string table = fresh_table("slowstmt");
  PostgresBackend b("");
  REQUIRE(b.create_schema(table));
  auto won = b.try_acquire(request(table, "job", 12));
  REQUIRE(won);
  admin("CREATE FUNCTION " + table + "_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(3); "
        "RETURN NEW; END $$");
  admin("CREATE TRIGGER slow BEFORE UPDATE ON " + table + " FOR EACH ROW EXECUTE FUNCTION " + table + "_slow()");

  const HolderKey key{LockRef{table, "job"}, "holder", won->fence, 12, 1s};
  auto beat = bounded([&] { return b.heartbeat(key); }, [] {});
  REQUIRE_FALSE(beat);
  INFO(beat.error().message());
  CHECK(beat.error() == Errc::backend_unavailable);
  CHECK(beat.error().detail.find("57014") != std::string::npos);  // query_canceled by statement_timeout

  admin("DROP TRIGGER slow ON " + table);
  CHECK(b.heartbeat(key));
}

TEST_CASE("a frozen server: operations fail within their timeout instead of blocking, and recover after",
          "[timeouts][freeze]") {
  const std::string table = fresh_table("freeze");
  PostgresBackend direct("");
  REQUIRE(direct.create_schema(table));

  FaultProxy proxy;
  PostgresOptions po;
  po.network_timeout = 0s;  // no TCP timeouts: only the backend's own deadline can end a frozen call
  po.reconnect_attempts = 1;
  po.default_timeout = 1s;  // bounds the LISTEN of a wait for release
  PostgresBackend b(proxy.dsn(), po);
  auto won = b.try_acquire(request(table, "job", 13));
  REQUIRE(won);
  REQUIRE(won->acquired);
  const HolderKey key{LockRef{table, "job"}, "holder", won->fence, 13, 1s};
  REQUIRE(b.heartbeat(key));
  // Prepares the release statement (and sets this timeout) before the freeze:
  // otherwise the PREPARE is what times out, and the release surely did not run.
  HolderKey not_ours = key;
  not_ours.fence += 1000;
  REQUIRE(b.release(not_ours).error() == Errc::lock_not_held);

  proxy.set("freeze");
  const auto unfreeze = [&] { proxy.set("reset"); };

  SECTION("a heartbeat: backend_unavailable") {
    auto beat = bounded([&] { return b.heartbeat(key); }, unfreeze);
    REQUIRE_FALSE(beat);
    INFO(beat.error().message());
    CHECK(beat.error() == Errc::backend_unavailable);
  }
  SECTION("a release: outcome_unknown, it was sent") {
    auto released = bounded([&] { return b.release(key); }, unfreeze);
    REQUIRE_FALSE(released);
    INFO(released.error().message());
    CHECK(released.error() == Errc::outcome_unknown);
  }
  SECTION("a wait for release ends (its LISTEN is bounded too)") {
    auto waited = bounded([&] { return b.wait_for_release(LockRef{table, "job"}, 1s); }, unfreeze);
    if (waited) CHECK_FALSE(*waited);
    else CHECK(waited.error() == Errc::backend_unavailable);
  }
  SECTION("connecting anew: backend_unavailable") {
    PostgresBackend fresh(proxy.dsn(), po);
    auto read = bounded([&] { return fresh.try_acquire(request(table, "other", 14)); }, unfreeze);
    REQUIRE_FALSE(read);
    INFO(read.error().message());
    CHECK(read.error() == Errc::backend_unavailable);  // nothing was sent: surely not applied
  }

  // Thawed: the next operation reconnects. The grant is still there, unless
  // the release's bytes, held by the frozen proxy, reached the server after
  // all: exactly why its outcome was reported unknown.
  proxy.set("pass");
  auto row = b.inspect(LockRef{table, "job"});
  REQUIRE(row);
  if (row->has_value()) {
    CHECK((*row)->token == 13u);
    CHECK(b.heartbeat(key));
  }
}

TEST_CASE("the fault proxy itself: reset breaks the connection, delay only slows it", "[timeouts][proxy]") {
  const std::string table = fresh_table("proxy");
  FaultProxy proxy;
  PostgresBackend b = backend_through(proxy, table);
  REQUIRE(b.inspect(LockRef{table, "job"}));

  proxy.set("delay 300");
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(b.inspect(LockRef{table, "job"}));
  CHECK(std::chrono::steady_clock::now() - t0 >= 300ms);

  proxy.set("reset");
  auto broken = b.inspect(LockRef{table, "job"});
  REQUIRE_FALSE(broken);
  CHECK(broken.error() == Errc::backend_unavailable);
  proxy.set("pass");
  CHECK(b.inspect(LockRef{table, "job"}));
}

// The server stores a prepared statement at its Parse, but answers only at
// the Sync behind it: a statement_timeout that fires in between (a slow
// link, a loaded server) reports an error for a statement that exists, and
// every later Parse of that name is refused with 42P05 ("already exists").
TEST_CASE("a statement the server prepared although it answered the Parse with its statement timeout is used, not refused",
          "[timeouts][statement][prepare]") {
  const std::string table = fresh_table("halfprep");
  FaultProxy proxy;
  PostgresBackend b = backend_through(proxy, table);
  REQUIRE(b.inspect(LockRef{table, "job"}));  // connected, the table's oid read: only the acquire is left to prepare

  // A 4 s operation: a 3 s statement_timeout (Bound::from), the Sync 3.5 s behind its Parse.
  const std::string lock = "job";  // outlives the request, which views it
  AcquireRequest r = request(table, lock, 21);
  r.timeout = 4s;
  proxy.set("delay-sync 3500");
  auto first = bounded([&] { return b.try_acquire(r); }, [&] { proxy.set("reset"); });
  proxy.set("pass");
  REQUIRE_FALSE(first);
  INFO(first.error().message());
  CHECK(first.error().detail.find("57014") != std::string::npos);  // the server's statement timeout, before the client's deadline

  auto won = b.try_acquire(r);  // the acquire's statement is on the server already: 42P05 without the fix
  INFO((won ? std::string() : won.error().message()));
  REQUIRE(won);
  CHECK(won->acquired);
  CHECK(proxy.accepted() == 1);  // one connection throughout: the statement it prepared is the one it runs
}

TEST_CASE("a connect the operation's deadline cuts short goes on: the next operation takes it up, no new server process",
          "[timeouts][proxy][connect]") {
  // Under load (every client reconnecting after a storm of
  // pg_terminate_backend), a server may take longer to start a backend than
  // an operation may wait. Closing the half-made connection and starting
  // another each time throws the server's work away, and enough such
  // clients keep everyone from connecting: the load test once stalled so.
  const std::string table = fresh_table("slowconnect");
  PostgresBackend direct("");
  REQUIRE(direct.create_schema(table));
  FaultProxy proxy;
  PostgresOptions po;
  po.reconnect_attempts = 1;
  // Two operations (1 s each) end before the connect can (a chunk each
  // way, delayed 1.2 s each), and the third has 0.6 s left for its queries
  // once the connect is made. (With 200 ms operations and 300 ms delays the
  // connect was made just as the third's deadline passed, which left its
  // queries no time: on a loaded machine the connection then went, rightly,
  // and a second was made.)
  po.default_timeout = 1s;
  po.connect_timeout = 30s;
  PostgresBackend b(proxy.dsn(), po);
  proxy.set("delay 1200");
  for (int i = 0; i < 2; ++i) {
    auto read = b.inspect(LockRef{table, "job"});
    REQUIRE_FALSE(read);
    INFO(read.error().message());
    CHECK(read.error() == Errc::backend_unavailable);
    CHECK_THAT(read.error().message(), Catch::Contains("the connect goes on"));
  }
  proxy.set("pass");  // what is in flight still arrives
  std::optional<pgmutex::Error> last;
  bool read_it = false;
  for (int i = 0; i < 10 && !read_it; ++i) {
    auto read = b.inspect(LockRef{table, "job"});
    read_it = read.has_value();
    if (!read_it) last = read.error();
  }
  INFO((last ? last->message() : std::string("no failure after the thaw")));
  CHECK(read_it);
  CHECK(proxy.accepted() == 1);  // every operation used the one connect

  SECTION("a connect past its own budget (connect_timeout) is given up, and the next one starts afresh") {
    PostgresOptions short_budget = po;
    short_budget.default_timeout = 300ms;
    short_budget.connect_timeout = 1s;
    PostgresBackend c(proxy.dsn(), short_budget);
    proxy.set("freeze");
    for (int i = 0; i < 5; ++i) CHECK_FALSE(c.inspect(LockRef{table, "job"}));  // 1.5 s: one budget ran out
    proxy.set("pass");
    bool read_c = false;
    for (int i = 0; i < 50 && !read_c; ++i) read_c = c.inspect(LockRef{table, "job"}).has_value();
    CHECK(read_c);
    CHECK(proxy.accepted() >= 3);  // b's, c's first (given up) and c's second
  }
}

namespace {

// Two hosts: the frozen proxy first, the real server (over TCP) second.
std::string frozen_first_keyword(const FaultProxy& frozen) {
  const Server s = server();
  return "host=127.0.0.1," + s.tcp_host + " port=" + frozen.port() + "," + s.port + " dbname=" + s.database +
         " user=" + s.user;
}
std::string frozen_first_uri(const FaultProxy& frozen) {
  const Server s = server();
  return "postgresql://" + s.user + "@127.0.0.1:" + frozen.port() + "," + s.tcp_host + ":" + s.port + "/" +
         s.database;
}

// Sets an environment variable for a scope, then puts back what was there
// (PGHOST and PGPORT point at the test's server).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// 4 s per host; the operation's own bound leaves room for both shares.
PostgresOptions four_seconds_per_host() {
  PostgresOptions po;
  po.connect_timeout = 4s;
  po.default_timeout = 9s;
  po.reconnect_attempts = 1;
  return po;
}

}  // namespace

TEST_CASE("a multi-host DSN whose first host never answers: each host has its own connect budget, the second serves",
          "[timeouts][multihost]") {
  // Before each host had its own share, the frozen first host used up the
  // whole connect budget and every connect failed on time, the second host
  // never tried.
  const std::string table = fresh_table("multihost");
  REQUIRE(PostgresBackend("").create_schema(table));
  FaultProxy frozen;
  frozen.set("freeze");  // accepts TCP, answers nothing: libpq waits for its SSL or start-up answer
  const auto thaw = [&] { frozen.set("reset"); };
  const auto held_on_server = [&](const std::string& lock) {
    return admin("SELECT count(*) FROM " + table + " WHERE lock_name = '" + lock + "'")[0][0].as<int>() == 1;
  };

  SECTION("a Mutex, keyword form") {
    pgmutex::Mutex mutex(PostgresBackend(frozen_first_keyword(frozen), four_seconds_per_host()),
                         options(table, "keyword", "multihost"));
    auto guard = bounded([&] { return mutex.try_acquire(); }, thaw);
    REQUIRE(guard);
    CHECK(held_on_server("keyword"));
    CHECK(guard.release(pgmutex::nothrow));
  }
  SECTION("a Mutex, URI form") {
    pgmutex::Mutex mutex(PostgresBackend(frozen_first_uri(frozen), four_seconds_per_host()),
                         options(table, "uri", "multihost"));
    auto guard = bounded([&] { return mutex.try_acquire(); }, thaw);
    REQUIRE(guard);
    CHECK(held_on_server("uri"));
    CHECK(guard.release(pgmutex::nothrow));
  }
  SECTION("a Session") {
    pgmutex::SessionOptions so;
    so.postgres = four_seconds_per_host();
    auto session = pgmutex::Session::create(frozen_first_keyword(frozen), so);
    pgmutex::SessionMutex mutex(session->backend(), options(table, "session", "multihost"));
    auto guard = bounded([&] { return mutex.try_acquire(); }, thaw);
    REQUIRE(guard);
    CHECK(held_on_server("session"));
    CHECK(guard.release(pgmutex::nothrow));
  }
  SECTION("the DSN's own connect_timeout is each host's share, as in libpq") {
    PostgresOptions po = four_seconds_per_host();
    po.connect_timeout = 30s;  // alone, the frozen host's share would outlast the operation
    pgmutex::Mutex mutex(PostgresBackend(frozen_first_keyword(frozen) + " connect_timeout=2", po),
                         options(table, "own_timeout", "multihost"));
    auto guard = bounded([&] { return mutex.try_acquire(); }, thaw);
    REQUIRE(guard);
    CHECK(held_on_server("own_timeout"));
    CHECK(guard.release(pgmutex::nothrow));
  }
  SECTION("per-host budgets longer than the operation: the time left is shared, so the second host is tried") {
    PostgresOptions po = four_seconds_per_host();
    po.connect_timeout = 30s;  // the acquire's own bound (heartbeat_timeout, 10 s here) ends sooner
    pgmutex::Mutex mutex(PostgresBackend(frozen_first_keyword(frozen), po), options(table, "shared", "multihost"));
    auto guard = bounded([&] { return mutex.try_acquire(); }, thaw);
    REQUIRE(guard);
    CHECK(held_on_server("shared"));
    CHECK(guard.release(pgmutex::nothrow));
  }
  SECTION("both hosts frozen: the failure names each host and its share") {
    PostgresOptions po = four_seconds_per_host();
    po.connect_timeout = 2s;
    const Server s = server();
    PostgresBackend both("host=127.0.0.1,127.0.0.1 port=" + frozen.port() + "," + frozen.port() + " dbname=" +
                             s.database + " user=" + s.user,
                         po);
    auto connected = bounded([&] { return both.connect(); }, thaw);
    REQUIRE_FALSE(connected);
    INFO(connected.error().message());
    CHECK(connected.error() == Errc::backend_unavailable);
    CHECK(connected.error().message().find("host 127.0.0.1 port " + frozen.port()) != std::string::npos);
    CHECK(connected.error().message().find("its share of the connect budget, 2 s, ran out") != std::string::npos);
  }
}

TEST_CASE("a multi-host DSN becomes one attempt per host, in libpq's order and pairing",
          "[timeouts][multihost][dsn]") {
  using pgmutex::postgres_detail::host_attempts;
  SECTION("one host: the string as it is") {
    const auto attempts = host_attempts("host=db port=5432 dbname=app");
    REQUIRE(attempts.size() == 1);
    CHECK(attempts[0].conninfo == "host=db port=5432 dbname=app");
  }
  SECTION("keyword form: each host with its port, everything else kept") {
    const auto attempts = host_attempts("host=a,b port=1,2 dbname=app password='it\\'s' target_session_attrs=read-write");
    REQUIRE(attempts.size() == 2);
    CHECK(attempts[0].conninfo == "host='a' port='1' dbname='app' password='it\\'s' target_session_attrs='read-write'");
    CHECK(attempts[1].conninfo == "host='b' port='2' dbname='app' password='it\\'s' target_session_attrs='read-write'");
    CHECK(attempts[1].server == "host b port 2");
  }
  SECTION("URI form, one port for all, an empty host entry (libpq's default)") {
    const auto uri = host_attempts("postgresql://me@a:7,b:8/app");
    REQUIRE(uri.size() == 2);
    CHECK(uri[1].conninfo == "host='b' port='8' dbname='app' user='me'");
    const auto shared = host_attempts("host=a,,c port=9");
    REQUIRE(shared.size() == 3);
    CHECK(shared[1].conninfo == "host='' port='9'");
    CHECK(shared[2].conninfo == "host='c' port='9'");
  }
  SECTION("prefer-standby: every host as a standby first, then as any server") {
    const auto attempts = host_attempts("host=a,b port=5 target_session_attrs=prefer-standby");
    REQUIRE(attempts.size() == 4);
    CHECK(attempts[0].conninfo == "host='a' port='5' target_session_attrs='standby'");
    CHECK(attempts[1].conninfo == "host='b' port='5' target_session_attrs='standby'");
    CHECK(attempts[2].conninfo == "host='a' port='5' target_session_attrs='any'");
    CHECK(attempts[3].conninfo == "host='b' port='5' target_session_attrs='any'");
  }
  SECTION("the host list from PGHOST when the DSN names none, the port from PGPORT") {
    ScopedEnv hosts("PGHOST", "x,y");
    ScopedEnv port("PGPORT", "6");
    const auto attempts = host_attempts("dbname=app");
    REQUIRE(attempts.size() == 2);
    CHECK(attempts[1].conninfo == "host='y' port='6' dbname='app'");
  }
}

TEST_CASE("a multi-host DSN whose lists do not pair up: invalid_argument, naming the input and the rule",
          "[timeouts][multihost][dsn]") {
  for (const std::string dsn : {"host=a,b port=1,2,3", "postgresql:///app?host=a,b&port=1,2,3",
                                "host=a,b hostaddr=127.0.0.1"}) {
    INFO(dsn);
    auto connected = PostgresBackend(dsn).connect();
    REQUIRE_FALSE(connected);
    INFO(connected.error().message());
    CHECK(connected.error() == Errc::invalid_argument);
    CHECK(connected.error().message().find(dsn.find("hostaddr") != std::string::npos ? "hostaddr='127.0.0.1'"
                                                                                    : "port='1,2,3'") !=
          std::string::npos);
    CHECK(connected.error().message().find(" per host") != std::string::npos);
  }
}
