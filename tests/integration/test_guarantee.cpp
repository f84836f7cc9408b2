// The holder's guarantee through pgmutex::Mutex on a real server: one lock's
// statement hangs (another session's row lock, or a frozen peer behind
// tests/tools/fault_proxy.py) and
//   - that lock's holder declares its lease lost on time, while it hangs;
//   - another lock of the same process, in the same table or another, keeps
//     its heartbeats and is never taken;
//   - a rival, connected directly, wins only after the holder knew.
// Each runs over every Postgres backend the holder may use: its own
// connection, a libpqxx pool's connection, and a pgmutex::Session.
// Real leases are short (1.5 s); timings are never asserted, only orders.
#include <signal.h>

#include <atomic>
#include <memory>
#include <sstream>
#include <thread>

#include "fault_proxy.hpp"
#include "pgmutex/postgres_pool.hpp"
#include "support.hpp"

using namespace itest;
using pgmutex::Mutex;
using pgmutex::PostgresBackend;

namespace {

// Lease 1.5 s, a beat every 200 ms, an attempt may take 0.5 s.
pgmutex::Options quick(std::string table, std::string lock, std::string instance) {
  auto o = options(std::move(table), std::move(lock), std::move(instance));
  o.heartbeat_interval = 200ms;
  o.alert_threshold = 2s;
  o.stale_threshold = 3s;
  o.safety_margin = 1500ms;
  o.heartbeat_timeout = 500ms;
  return o;
}

// Polls `step` every 20 ms for up to `limit`; true once it returned true.
template <class Step>
bool poll_until(Step step, std::chrono::seconds limit = 20s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (step()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// A pool of one libpqxx connection: the backend runs one operation at a time.
struct OneConnectionPool {
  explicit OneConnectionPool(const std::string& dsn) : connection(dsn) {}
  pqxx::connection& borrow() { return connection; }
  void give_back(pqxx::connection&) noexcept {}
  pqxx::connection connection;
};

// The holder's mutex over one kind of backend, connected through `dsn`.
struct Holder {
  enum class Kind { own, pool };
  static const char* name(Kind k) { return k == Kind::own ? "own connection" : "libpqxx pool"; }

  Holder(Kind kind, const std::string& dsn, pgmutex::Options o)
      : pool(kind == Kind::pool ? std::make_unique<OneConnectionPool>(dsn) : nullptr),
        mutex(pool ? pgmutex::make_pooled_backend(*pool) : PostgresBackend(dsn), std::move(o)) {}

  std::unique_ptr<OneConnectionPool> pool;  // outlives the mutex
  Mutex mutex;
};

struct TwoLocks {
  std::string table = fresh_table("guarantee");
  std::string other_table;
  Mutex y;
  Mutex::guard_type gy;

  explicit TwoLocks(bool same_table)
      : other_table(same_table ? table : fresh_table("guarantee_other")),
        y(PostgresBackend(""), quick(other_table, "y", "holder")) {
    Mutex setup(PostgresBackend(""), quick(table, "x", "setup"));
    setup.create_schema();
    y.create_schema();
    gy = y.try_acquire();
    REQUIRE(gy);
  }
};

}  // namespace

TEST_CASE("a heartbeat behind another session's row lock: its holder gives up on time, the other lock goes on",
          "[guarantee][rowlock]") {
  const bool same_table = GENERATE(true, false);
  const Holder::Kind kind = GENERATE(Holder::Kind::own, Holder::Kind::pool);
  INFO((same_table ? "both locks in one table" : "the locks in two tables") << ", the holder on its " << Holder::name(kind));
  TwoLocks locks(same_table);
  Holder holder(kind, "", quick(locks.table, "x", "holder"));
  Mutex& x = holder.mutex;
  auto gx = x.try_acquire();
  REQUIRE(gx);

  // Another session locks x's row for 5 s: x's heartbeats wait on it (each
  // ended by its lock_timeout and retried), and so would a rival's reclaim.
  std::atomic<bool> blocker_done{false};
  std::thread blocker([&] {
    pqxx::connection c("");
    pqxx::work tx(c);
    tx.exec("SELECT 1 FROM " + locks.table + " WHERE lock_name = 'x' FOR UPDATE");
    tx.exec("SELECT pg_sleep(5)");
    tx.commit();
    blocker_done = true;
  });

  bool lost_while_blocked = false;
  CHECK(poll_until([&] {
    (void)gx.fence();  // the accessors answer while the statement waits
    (void)x.held();
    if (!gx.lost()) return false;
    lost_while_blocked = !blocker_done;
    return true;
  }));
  CHECK(lost_while_blocked);
  CHECK(gx.stop_token().stop_requested());
  blocker.join();

  // The rival can take x once the row is stale; y was never in danger.
  Mutex rival(PostgresBackend(""), quick(locks.table, "x", "rival"));
  CHECK(poll_until([&] { return static_cast<bool>(rival.try_acquire()); }));
  CHECK_FALSE(locks.gy.lost());
  CHECK(locks.y.held());
  auto y_row = locks.y.inspect();
  REQUIRE(y_row);
  CHECK(y_row->instance_id == "holder");
  CHECK(y_row->seconds_since_heartbeat < 1.5);
}

TEST_CASE("a frozen peer: the holder knows before a rival connected directly can take the lock",
          "[guarantee][frozen]") {
  const bool same_table = GENERATE(true, false);
  const Holder::Kind kind = GENERATE(Holder::Kind::own, Holder::Kind::pool);
  INFO((same_table ? "both locks in one table" : "the locks in two tables") << ", the holder on its " << Holder::name(kind));
  TwoLocks locks(same_table);
  FaultProxy proxy;
  Holder holder(kind, proxy.dsn(), quick(locks.table, "x", "holder"));
  Mutex& x = holder.mutex;
  auto gx = x.try_acquire();
  REQUIRE(gx);

  proxy.set("freeze");  // the server never answers x again; the kernel still ACKs
  Mutex rival(PostgresBackend(""), quick(locks.table, "x", "rival"));
  bool holder_knew_first = false;
  CHECK(poll_until([&] {
    (void)gx.fence();
    (void)x.held();
    auto won = rival.try_acquire();
    if (!won) return false;
    holder_knew_first = gx.lost();  // read right after the rival won
    return true;
  }));
  CHECK(holder_knew_first);
  CHECK(gx.stop_token().stop_requested());
  CHECK_FALSE(locks.gy.lost());
  CHECK(locks.y.held());
  proxy.set("pass");
}

// A holder process stopped (SIGSTOP) past its lease while a rival takes the
// lock, then continued (SIGCONT): at that moment its lease timer has not run
// yet, and only a read that compares the clock with the deadline says
// "lost". The holder reads its guard in a tight loop, as a job that checks
// before each write would; its last "held" read must come before the
// rival's grant. Several rounds: the race with the timer thread is won
// about half the time by a read that trusts a flag.
TEST_CASE("a holder paused past its lease reads lost from its first read after SIGCONT", "[guarantee][pause]") {
  const std::string kind = GENERATE(as<std::string>{}, "mutex", "session");
  CAPTURE(kind);
  const std::string table = fresh_table("paused");
  Mutex(PostgresBackend(""), options(table, "job")).create_schema();
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    Child holder = spawn_child({"watch", table, "job", "paused-holder", kind});
    const std::string acquired = read_line(holder, 10s);
    REQUIRE(acquired.starts_with("acquired "));
    std::this_thread::sleep_for(300ms);  // heartbeats going
    REQUIRE(::kill(holder.pid, SIGSTOP) == 0);

    auto o = options(table, "job", "rival");
    o.heartbeat_interval = 200ms;
    o.alert_threshold = 1s;
    o.stale_threshold = 2s;
    Mutex rival(PostgresBackend(""), o);
    auto guard = rival.acquire(std::chrono::nanoseconds(10s));  // once the holder's row is 2 s stale
    REQUIRE(guard);
    const long long granted = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now().time_since_epoch())
                                  .count();
    REQUIRE(::kill(holder.pid, SIGCONT) == 0);
    const std::string lost = read_line(holder, 10s);
    REQUIRE(lost.starts_with("lost "));
    std::istringstream fields(lost.substr(5));
    long long last_held = 0, first_lost = 0, checks = 0;
    fields >> last_held >> first_lost >> checks;
    INFO("last 'held' read " << (last_held - granted) / 1000 << " us after the rival's grant; " << checks
                             << " reads in all");
    CHECK(last_held < granted);
    CHECK(wait_child(holder) == 0);
    guard.release();
  }
}
