// Every operation has a bound: a heartbeat or release stuck behind another
// session's row lock, a statement the server runs too long, and a server that
// froze (TCP open, nothing answered) all end in an error within the
// operation's timeout instead of blocking. Timings are not asserted tightly
// (these machines are noisy): a watchdog fails the test instead of hanging it.
#include <future>
#include <thread>

#include "fault_proxy.hpp"
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
  PostgresBackend direct("");
  REQUIRE(direct.create_schema(table));
  FaultProxy proxy;
  PostgresOptions po;
  po.reconnect_attempts = 1;
  PostgresBackend b(proxy.dsn(), po);
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
