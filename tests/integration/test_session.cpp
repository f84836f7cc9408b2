// pgmutex::Session on a real server: many locks, one connection.
//   - heartbeats of many locks go out as one statement per tick;
//   - waiters cost no statement while they wait, wake on a release (NOTIFY),
//     at the holder's stale deadline, and after a reconnect;
//   - a hung statement (row lock, frozen peer) on the shared connection:
//     every lock's watchdog still fires on time, and the session recovers;
//   - durability is judged per mutex, not per connection.
// Timings are asserted loosely (noisy machines); intervals are short so no
// test sleeps long.
#include <atomic>
#include <future>
#include <thread>

#include "fault_proxy.hpp"
#include "pgmutex/session.hpp"
#include "pgmutex/testing/recording_metrics.hpp"
#include "session_core.hpp"
#include "support.hpp"

using namespace itest;
using pgmutex::AcquireRequest;
using pgmutex::BeatReply;
using pgmutex::Errc;
using pgmutex::HolderKey;
using pgmutex::LockRef;
using pgmutex::PostgresBackend;
using pgmutex::Session;
using pgmutex::SessionBackend;
using pgmutex::SessionMutex;
using pgmutex::SessionOptions;
using pgmutex::WatchRequest;
using RecordingMutex = pgmutex::BasicMutex<PostgresBackend, pgmutex::SteadyClock, pgmutex::testing::RecordingMetrics>;
using RecordingSessionMutex =
    pgmutex::BasicMutex<SessionBackend, pgmutex::SteadyClock, pgmutex::testing::RecordingMetrics>;

namespace {

// A DSN whose connections pg_stat_activity can tell apart.
std::string tagged_dsn(const std::string& tag) { return "application_name=" + tag; }
std::string fresh_tag(std::string_view stem) { return std::string(stem) + "_" + std::to_string(::getpid()); }

long connections_named(const std::string& tag) {
  return admin("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + tag + "'")[0][0].as<long>();
}

template <class Step>
bool poll_until(Step step, std::chrono::milliseconds limit = 20s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (step()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

AcquireRequest request(const std::string& table, const std::string& lock, const std::string& instance,
                       std::chrono::nanoseconds stale = 60s, pgmutex::GrantToken token = 7) {
  AcquireRequest r;
  r.lock = LockRef{table, lock};
  r.instance_id = instance;
  r.stale_threshold = stale;
  r.token = token;
  return r;
}

// Lease 1.5 s, a beat every 200 ms, an attempt may take 0.5 s (as test_guarantee.cpp).
pgmutex::Options quick(std::string table, std::string lock, std::string instance) {
  auto o = options(std::move(table), std::move(lock), std::move(instance));
  o.heartbeat_interval = 200ms;
  o.alert_threshold = 2s;
  o.stale_threshold = 3s;
  o.safety_margin = 1500ms;
  o.heartbeat_timeout = 500ms;
  return o;
}

// Sends one heartbeat_async for each key and waits for every answer.
std::vector<BeatReply> beat_all(SessionBackend& backend, const std::vector<HolderKey>& keys) {
  std::vector<std::promise<BeatReply>> promises(keys.size());
  std::vector<std::future<BeatReply>> futures;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    futures.push_back(promises[i].get_future());
    REQUIRE(backend.heartbeat_async(keys[i], [&promises, i](BeatReply reply) { promises[i].set_value(std::move(reply)); }));
  }
  std::vector<BeatReply> out;
  for (auto& f : futures) {
    REQUIRE(f.wait_for(10s) == std::future_status::ready);
    out.push_back(f.get());
  }
  return out;
}

// Threads that are stopped and joined however the test ends (a failed
// REQUIRE included), so a failure reports instead of aborting.
struct Crew {
  std::stop_source stop;
  std::vector<std::thread> threads;
  Crew() = default;
  Crew(const Crew&) = delete;
  Crew& operator=(const Crew&) = delete;
  ~Crew() {
    stop.request_stop();
    for (auto& t : threads)
      if (t.joinable()) t.join();
  }
};

}  // namespace

TEST_CASE("50 locks on one session: one heartbeat statement per tick, one connection", "[session][beats]") {
  const std::string table = fresh_table("session_beats");
  const std::string tag = fresh_tag("pgmutex_beats");
  SessionOptions so;
  so.heartbeat_tick = 50ms;
  auto session = Session::create(tagged_dsn(tag), so);
  SessionBackend backend = session->backend();
  REQUIRE(backend.create_schema(table));
  constexpr int n = 50;
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back("lock" + std::to_string(i));
  std::vector<HolderKey> keys;
  for (int i = 0; i < n; ++i) {
    auto won = backend.try_acquire(request(table, names[i], "holder"));
    REQUIRE(won);
    REQUIRE(won->acquired);
    keys.push_back(HolderKey{{table, names[i]}, "holder", won->fence, 7, 2s});
  }
  const auto before = session->stats();
  constexpr int rounds = 3;
  for (int r = 0; r < rounds; ++r)
    for (const BeatReply& reply : beat_all(backend, keys)) CHECK(reply.result);
  const auto after = session->stats();
  CHECK(after.heartbeat_statements - before.heartbeat_statements == rounds);
  CHECK(after.heartbeats - before.heartbeats == rounds * n);
  CHECK(connections_named(tag) == 1);
  CHECK(after.connects == 1);

  // A key that is not held is told so, the others in its batch are not.
  keys[0].fence += 1000;
  const auto replies = beat_all(backend, keys);
  REQUIRE_FALSE(replies[0].result);
  CHECK(replies[0].result.error() == Errc::lock_not_held);
  for (std::size_t i = 1; i < replies.size(); ++i) CHECK(replies[i].result);
}

TEST_CASE("SessionMutex: 50 held locks keep their leases on one connection", "[session][beats][mutex]") {
  const std::string table = fresh_table("session_mutexes");
  const std::string tag = fresh_tag("pgmutex_mutexes");
  SessionOptions so;
  so.heartbeat_tick = 100ms;
  auto session = Session::create(tagged_dsn(tag), so);
  std::vector<SessionMutex> mutexes;
  std::vector<SessionMutex::guard_type> guards;
  constexpr int n = 50;
  for (int i = 0; i < n; ++i) {
    auto o = quick(table, "m" + std::to_string(i), "holder");
    mutexes.emplace_back(session->backend(), o);
  }
  mutexes.front().create_schema();
  for (auto& m : mutexes) {
    guards.push_back(m.try_acquire());
    REQUIRE(guards.back());
  }
  const auto before = session->stats();
  std::this_thread::sleep_for(2s);  // > the lease (1.5 s): a missed heartbeat would show
  const auto after = session->stats();
  for (auto& g : guards) CHECK_FALSE(g.lost());
  for (auto& m : mutexes) CHECK(m.held());
  CHECK(connections_named(tag) == 1);
  // Ten beats per mutex in 2 s. Batched: about one statement per tick
  // (20), never one per heartbeat (500). Without batching (a mutex that
  // blocks on heartbeat()) each one is a statement of its own.
  INFO("heartbeat statements " << after.heartbeat_statements - before.heartbeat_statements << ", statements "
                               << after.statements - before.statements);
  CHECK(after.statements - before.statements < 100);
  CHECK(after.heartbeats - before.heartbeats >= 5 * n);
}

TEST_CASE("20 waiters on one lock: no statement while they wait, each release wakes them",
          "[session][waiters]") {
  const std::string table = fresh_table("session_waiters");
  const std::string tag = fresh_tag("pgmutex_waiters");
  auto session = Session::create(tagged_dsn(tag));
  PostgresBackend holder("");
  REQUIRE(holder.create_schema(table));
  auto held = holder.try_acquire(request(table, "w", "first"));
  REQUIRE(held);
  REQUIRE(held->acquired);

  constexpr int n = 20;
  std::atomic<int> waiting{0}, winners{0}, released{0}, failures{0};  // Catch's CHECK is for the main thread only
  std::atomic<int> may_release{0};
  Crew crew;
  std::stop_source& stop = crew.stop;
  std::vector<std::thread>& threads = crew.threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      SessionBackend b = session->backend();
      const std::string me = "waiter" + std::to_string(i);
      while (!stop.get_token().stop_requested()) {
        auto tried = b.try_acquire(request(table, "w", me));
        if (!tried) continue;
        if (tried->acquired) {
          const int rank = ++winners;
          while (may_release.load() < rank && !stop.get_token().stop_requested()) std::this_thread::sleep_for(5ms);
          if (!b.release(HolderKey{{table, "w"}, me, tried->fence, 7})) ++failures;
          ++released;
          return;
        }
        ++waiting;
        auto woke = b.wait_until_free(WatchRequest{{table, "w"}, 60s, std::nullopt}, 30s, stop.get_token());
        --waiting;
        if (!woke) ++failures;
      }
    });
  }
  REQUIRE(poll_until([&] { return waiting.load() == n; }));
  std::this_thread::sleep_for(100ms);  // all registered
  const auto idle_from = session->stats();
  std::this_thread::sleep_for(1s);
  const auto idle_to = session->stats();
  CHECK(idle_to.statements - idle_from.statements == idle_to.rechecks - idle_from.rechecks);
  CHECK(idle_to.statements - idle_from.statements == 0);
  CHECK(connections_named(tag) == 1);

  REQUIRE(holder.release(HolderKey{{table, "w"}, "first", held->fence, 7}));
  REQUIRE(poll_until([&] { return winners.load() == 1; }, 5s));
  CHECK(session->stats().notifications > idle_to.notifications);
  REQUIRE(poll_until([&] { return waiting.load() == n - 1; }, 5s));
  CHECK(winners.load() == 1);  // exactly one got it
  may_release = 1;
  REQUIRE(poll_until([&] { return winners.load() == 2; }, 5s));
  REQUIRE(poll_until([&] { return waiting.load() == n - 2; }, 5s));
  CHECK(winners.load() == 2);
  stop.request_stop();  // the waiters' waits end (false) and they go
  may_release = n;
  for (auto& t : threads) t.join();
  CHECK(released.load() == 2);
  CHECK(failures.load() == 0);
}

TEST_CASE("a waiter wakes at the holder's stale deadline, without a NOTIFY or a poll", "[session][stale]") {
  const std::string table = fresh_table("session_stale");
  auto session = Session::create("");
  PostgresBackend dead_holder("");
  REQUIRE(dead_holder.create_schema(table));
  // The holder never heartbeats: its row goes stale 1 s after the grant.
  auto held = dead_holder.try_acquire(request(table, "s", "dead", 1s));
  REQUIRE(held);
  REQUIRE(held->acquired);
  SessionBackend waiter = session->backend();
  auto tried = waiter.try_acquire(request(table, "s", "waiter", 1s));
  REQUIRE(tried);
  REQUIRE_FALSE(tried->acquired);

  const auto started = std::chrono::steady_clock::now();
  const auto before = session->stats();
  auto woke = waiter.wait_until_free(WatchRequest{{table, "s"}, 1s, 1s - std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                                             std::chrono::duration<double>(tried->holder_age_s))},
                                     10s, {});
  const auto took = std::chrono::steady_clock::now() - started;
  const auto after = session->stats();
  REQUIRE(woke);
  CHECK(*woke);
  INFO("woke after " << std::chrono::duration<double>(took).count() << " s");
  CHECK(took < 3s);
  CHECK(after.notifications == before.notifications);
  // The registration read and the check at the deadline; no polling.
  CHECK(after.rechecks - before.rechecks <= 3);
  auto won = waiter.try_acquire(request(table, "s", "waiter", 1s));
  REQUIRE(won);
  CHECK(won->acquired);
  CHECK(won->reclaimed);

  // A wait that nothing ends returns false at its timeout, and one stopped returns false at once.
  auto second = waiter.wait_until_free(WatchRequest{{table, "s"}, 60s, std::nullopt}, 200ms, {});
  REQUIRE(second);
  CHECK_FALSE(*second);
  std::stop_source stop;
  stop.request_stop();
  auto stopped = waiter.wait_until_free(WatchRequest{{table, "s"}, 60s, std::nullopt}, 10s, stop.get_token());
  REQUIRE(stopped);
  CHECK_FALSE(*stopped);
  // Bad input is named.
  auto bad = waiter.wait_until_free(WatchRequest{{"no such;table", "s"}, 1s, std::nullopt}, 1s, {});
  REQUIRE_FALSE(bad);
  CHECK(bad.error() == Errc::invalid_argument);
}

TEST_CASE("the session's connection is terminated while waiters wait: they wake, and get the lock on release",
          "[session][reconnect]") {
  const std::string table = fresh_table("session_reconnect");
  const std::string tag = fresh_tag("pgmutex_reconnect");
  auto session = Session::create(tagged_dsn(tag));
  PostgresBackend holder("");
  REQUIRE(holder.create_schema(table));
  auto held = holder.try_acquire(request(table, "r", "first"));
  REQUIRE((held && held->acquired));

  constexpr int n = 5;
  std::atomic<int> waiting{0}, winners{0}, wakes{0};
  Crew crew;
  std::stop_source& stop = crew.stop;
  std::vector<std::thread>& threads = crew.threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      SessionBackend b = session->backend();
      const std::string me = "waiter" + std::to_string(i);
      while (!stop.get_token().stop_requested()) {
        auto tried = b.try_acquire(request(table, "r", me));
        if (!tried) {
          std::this_thread::sleep_for(20ms);
          continue;
        }
        if (tried->acquired) {
          ++winners;
          return;  // keeps it: the others wait until stopped
        }
        ++waiting;
        auto woke = b.wait_until_free(WatchRequest{{table, "r"}, 60s, std::nullopt}, 30s, stop.get_token());
        --waiting;
        if (woke && *woke) ++wakes;
      }
    });
  }
  REQUIRE(poll_until([&] { return waiting.load() == n; }));
  REQUIRE(connections_named(tag) == 1);
  admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '" + tag + "'");
  // The loss is seen on the idle socket: every waiter wakes, tries again
  // (reconnecting) and waits again on a fresh LISTEN.
  REQUIRE(poll_until([&] { return wakes.load() >= n; }, 10s));
  REQUIRE(poll_until([&] { return waiting.load() == n; }, 10s));
  CHECK(session->stats().connects >= 2);
  CHECK(connections_named(tag) == 1);
  REQUIRE(holder.release(HolderKey{{table, "r"}, "first", held->fence, 7}));
  REQUIRE(poll_until([&] { return winners.load() == 1; }, 5s));
  stop.request_stop();
  for (auto& t : threads) t.join();
  CHECK(winners.load() == 1);
}

TEST_CASE("per mutex durability: one lock's durable write never vouches for another's", "[session][durable]") {
  const std::string table = fresh_table("session_durable");
  SessionOptions so;
  so.heartbeat_tick = 20ms;
  auto session = Session::create("", so);
  SessionBackend a = session->backend();
  SessionBackend b = session->backend();
  REQUIRE(a.create_schema(table));
  const auto& mark_a = pgmutex::postgres_detail::SessionAccess::mark(a);
  const auto& mark_b = pgmutex::postgres_detail::SessionAccess::mark(b);
  using Mark = pgmutex::postgres_detail::DurableMark;
  CHECK(mark_a->history == Mark::none);  // no durable write yet: a first heartbeat would be durable

  auto won_a = a.try_acquire(request(table, "a", "holder"));
  REQUIRE((won_a && won_a->acquired));
  const std::uint64_t history = a.history();
  CHECK(mark_a->history == history);  // the acquire committed synchronously
  CHECK(mark_b->history == Mark::none);  // ... for a alone
  CHECK_FALSE(mark_a->due(history));     // a's heartbeats may commit asynchronously
  CHECK(mark_b->due(history));           // b's first may not

  // b heartbeats a grant it did not acquire itself (its acquire went through
  // another backend): its first heartbeat is sent durable, and noted.
  auto won_b = a.try_acquire(request(table, "b", "holder"));
  REQUIRE((won_b && won_b->acquired));
  const HolderKey key_b{{table, "b"}, "holder", won_b->fence, 7, 2s};
  auto replies = beat_all(b, {key_b});
  REQUIRE(replies[0].result);
  CHECK(replies[0].history == history);
  CHECK(mark_b->history == history);
  // A mark from another history makes the next heartbeat durable again.
  mark_b->history = history + 1;
  REQUIRE(b.heartbeat(key_b));
  CHECK(mark_b->history == history);
}

TEST_CASE("a heartbeat behind another session's row lock on the shared connection: watchdogs fire on time, "
          "the session recovers",
          "[session][guarantee][rowlock]") {
  const std::string table = fresh_table("session_rowlock");
  auto session = Session::create("");
  SessionMutex x(session->backend(), quick(table, "x", "holder"));
  SessionMutex y(session->backend(), quick(table, "y", "holder"));
  x.create_schema();
  auto gx = x.try_acquire();
  auto gy = y.try_acquire();
  REQUIRE(gx);
  REQUIRE(gy);

  std::atomic<bool> blocker_done{false};
  std::thread blocker([&] {
    pqxx::connection c("");
    pqxx::work tx(c);
    tx.exec("SELECT 1 FROM " + table + " WHERE lock_name = 'x' FOR UPDATE");
    tx.exec("SELECT pg_sleep(5)");
    tx.commit();
    blocker_done = true;
  });
  bool lost_while_blocked = false;
  CHECK(poll_until([&] {
    (void)gx.fence();
    (void)x.held();
    if (!gx.lost()) return false;
    lost_while_blocked = !blocker_done;
    return true;
  }));
  CHECK(lost_while_blocked);
  CHECK(gx.stop_token().stop_requested());
  blocker.join();

  // A rival wins x only once it is stale. y shares x's table and x's batch
  // statement: the batch skips x's locked row, so y's heartbeats went on.
  pgmutex::Mutex rival_x(PostgresBackend(""), quick(table, "x", "rival"));
  CHECK(poll_until([&] { return static_cast<bool>(rival_x.try_acquire()); }));
  CHECK_FALSE(gy.lost());
  CHECK(y.held());
  auto y_row = y.inspect();
  REQUIRE(y_row);
  CHECK(y_row->instance_id == "holder");
  CHECK(y_row->seconds_since_heartbeat < 1.5);
  // The session recovered: a new lock on it is granted and kept.
  SessionMutex z(session->backend(), quick(table, "z", "holder"));
  auto gz = z.try_acquire();
  REQUIRE(gz);
  std::this_thread::sleep_for(2s);
  CHECK_FALSE(gz.lost());
}

TEST_CASE("a frozen peer under the shared connection: every holder knows before a rival can take its lock, "
          "and the session recovers once it thaws",
          "[session][guarantee][frozen]") {
  const std::string table = fresh_table("session_frozen");
  FaultProxy proxy;
  SessionOptions so;
  so.postgres.default_timeout = 2s;
  auto session = Session::create(proxy.dsn(), so);
  SessionMutex x(session->backend(), quick(table, "x", "holder"));
  SessionMutex y(session->backend(), quick(table, "y", "holder"));
  x.create_schema();
  auto gx = x.try_acquire();
  auto gy = y.try_acquire();
  REQUIRE(gx);
  REQUIRE(gy);

  proxy.set("freeze");  // the server never answers the session again; the kernel still ACKs
  pgmutex::Mutex rival_x(PostgresBackend(""), quick(table, "x", "rival"));
  pgmutex::Mutex rival_y(PostgresBackend(""), quick(table, "y", "rival"));
  bool x_knew_first = false, y_knew_first = false;
  CHECK(poll_until([&] {
    (void)gx.fence();
    (void)x.held();
    auto won = rival_x.try_acquire();
    if (!won) return false;
    x_knew_first = gx.lost();
    return true;
  }));
  CHECK(poll_until([&] {
    auto won = rival_y.try_acquire();
    if (!won) return false;
    y_knew_first = gy.lost();
    return true;
  }));
  CHECK(x_knew_first);
  CHECK(y_knew_first);
  CHECK(gx.stop_token().stop_requested());

  proxy.set("pass");
  // Thawed: the session opens a fresh connection and serves a new lock.
  SessionMutex z(session->backend(), quick(table, "z", "holder"));
  pgmutex::SessionMutex::guard_type gz;
  CHECK(poll_until([&] {
    auto r = z.try_acquire(pgmutex::nothrow);
    if (r && *r) gz = std::move(*r);
    return static_cast<bool>(gz);
  }));
  std::this_thread::sleep_for(2s);
  CHECK_FALSE(gz.lost());
}

TEST_CASE("20 SessionMutex blocked in acquire on one held lock: idle, they cost no statement; each release "
          "hands the lock to exactly one",
          "[session][waiters][mutex]") {
  const std::string table = fresh_table("session_mutex_waiters");
  const std::string tag = fresh_tag("pgmutex_mutex_waiters");
  auto session = Session::create(tagged_dsn(tag));
  pgmutex::Mutex holder(PostgresBackend(""), quick(table, "w", "first"));
  holder.create_schema();
  auto first = holder.try_acquire();
  REQUIRE(first);

  constexpr int n = 20;
  std::vector<SessionMutex> waiters;
  // The default thresholds: the head and the runner-up in line would also
  // look once the holder passed their alert threshold (quick's is 2 s).
  for (int i = 0; i < n; ++i) waiters.emplace_back(session->backend(), options(table, "w", "waiter" + std::to_string(i)));
  std::atomic<int> winners{0}, may_release{0}, finished{0}, failures{0};
  Crew crew;
  for (int i = 0; i < n; ++i)
    crew.threads.emplace_back([&, i] {
      auto g = waiters[static_cast<std::size_t>(i)].acquire(30s, crew.stop.get_token());
      if (g) {
        const int rank = ++winners;
        while (may_release.load() < rank && !crew.stop.get_token().stop_requested()) std::this_thread::sleep_for(5ms);
        if (!g.release(pgmutex::nothrow)) ++failures;
      }
      ++finished;
    });
  // Each waiter's try, then its place in the queue (a LISTEN the first
  // time, the enqueue, the Parse of its handoff's statements); then nothing.
  std::this_thread::sleep_for(1500ms);
  const auto idle_from = session->stats();
  std::this_thread::sleep_for(1s);
  const auto idle_to = session->stats();
  CHECK(idle_to.statements - idle_from.statements == 0);
  CHECK(idle_to.rechecks - idle_from.rechecks == 0);
  CHECK(connections_named(tag) == 1);

  first.release();
  REQUIRE(poll_until([&] { return winners.load() == 1; }, 5s));
  std::this_thread::sleep_for(300ms);
  CHECK(winners.load() == 1);  // exactly one got it; the others wait again
  may_release = 1;
  REQUIRE(poll_until([&] { return winners.load() == 2; }, 5s));
  std::this_thread::sleep_for(300ms);
  CHECK(winners.load() == 2);
  crew.stop.request_stop();  // the others' acquires end (cancelled)
  may_release = n;
  REQUIRE(poll_until([&] { return finished.load() == n; }, 10s));
  CHECK(failures.load() == 0);
}

TEST_CASE("watch_async: woken once on the session's thread by a release; cancel_watch before that wins",
          "[session][watch]") {
  const std::string table = fresh_table("session_watch");
  auto session = Session::create("");
  PostgresBackend holder("");
  REQUIRE(holder.create_schema(table));
  auto held = holder.try_acquire(request(table, "v", "first"));
  REQUIRE((held && held->acquired));
  SessionBackend b = session->backend();

  std::atomic<int> calls{0};
  auto cancelled = b.watch_async(WatchRequest{{table, "v"}, 60s, std::nullopt}, [&] { ++calls; });
  REQUIRE(cancelled);
  CHECK(b.cancel_watch(*cancelled));
  CHECK_FALSE(b.cancel_watch(*cancelled));  // only once

  std::promise<std::thread::id> woken_on;
  auto watched = b.watch_async(WatchRequest{{table, "v"}, 60s, std::nullopt}, [&] {
    ++calls;
    woken_on.set_value(std::this_thread::get_id());
  });
  REQUIRE(watched);
  REQUIRE(holder.release(HolderKey{{table, "v"}, "first", held->fence, 7}));
  auto on = woken_on.get_future();
  REQUIRE(on.wait_for(5s) == std::future_status::ready);
  CHECK(on.get() != std::this_thread::get_id());
  CHECK_FALSE(b.cancel_watch(*watched));  // it ran
  std::this_thread::sleep_for(100ms);
  CHECK(calls.load() == 1);

  // The lock is free now: a new watch is woken at once.
  std::promise<void> at_once;
  auto free_now = b.watch_async(WatchRequest{{table, "v"}, 60s, std::nullopt}, [&] { at_once.set_value(); });
  REQUIRE(free_now);
  CHECK(at_once.get_future().wait_for(2s) == std::future_status::ready);
  auto bad = b.watch_async(WatchRequest{{table, ""}, 60s, std::nullopt}, [] {});
  REQUIRE_FALSE(bad);
  CHECK(bad.error() == Errc::invalid_argument);
}

TEST_CASE("without LISTEN (unnamed statements, as behind a transaction pooler) a release is found by the "
          "re-check every unnamed_recheck_interval",
          "[session][unnamed]") {
  const std::string table = fresh_table("session_unnamed");
  SessionOptions so;
  so.postgres.statement_mode = pgmutex::StatementMode::unnamed;
  so.unnamed_recheck_interval = 200ms;
  auto session = Session::create("", so);
  PostgresBackend holder("");
  REQUIRE(holder.create_schema(table));
  auto held = holder.try_acquire(request(table, "u", "first"));
  REQUIRE((held && held->acquired));
  SessionBackend b = session->backend();
  auto waited = std::async(std::launch::async, [&] {
    return b.wait_until_free(WatchRequest{{table, "u"}, 60s, std::nullopt}, 10s, {});
  });
  std::this_thread::sleep_for(600ms);
  CHECK(waited.wait_for(0s) == std::future_status::timeout);  // the re-checks found it held
  const auto released = std::chrono::steady_clock::now();
  REQUIRE(holder.release(HolderKey{{table, "u"}, "first", held->fence, 7}));
  REQUIRE(waited.wait_for(5s) == std::future_status::ready);
  const auto took = std::chrono::steady_clock::now() - released;
  auto woke = waited.get();
  REQUIRE(woke);
  CHECK(*woke);
  INFO("woken " << std::chrono::duration<double>(took).count() << " s after the release");
  CHECK(took < 1500ms);
  const auto stats = session->stats();
  CHECK(stats.notifications == 0);
  CHECK(stats.rechecks >= 3);  // the registration, and re-checks every 200 ms
}

TEST_CASE("a session with options that cannot work is refused, naming the option and its rule", "[session][options]") {
  pgmutex::SessionOptions zero_tick;
  zero_tick.heartbeat_tick = 0ms;
  auto refused = Session::create(pgmutex::nothrow, "", zero_tick);
  REQUIRE_FALSE(refused);
  CHECK(refused.error() == Errc::invalid_argument);
  CHECK_THAT(refused.error().message(), Catch::Contains("SessionOptions::heartbeat_tick must be positive"));

  pgmutex::SessionOptions negative_recheck;
  negative_recheck.recheck_interval = -1s;
  CHECK_THROWS_AS(Session::create("", negative_recheck), pgmutex::InvalidArgumentError);

  auto fine = Session::create(pgmutex::nothrow, "", pgmutex::SessionOptions{});
  REQUIRE(fine);
  CHECK((*fine)->connect());
}

TEST_CASE("a heartbeat timeout equal to the session's tick: each beat goes out before its deadline",
          "[session][tick]") {
  // stale 3 s, interval 100 ms: the mutex derives a 0.1 s heartbeat timeout,
  // the session's default tick. A beat that waited the whole tick would fail
  // unsent, every time, and the lease would run out with nothing sent.
  const std::string table = fresh_table("session_tick");
  auto session = Session::create("");
  REQUIRE(session->options().heartbeat_tick == 100ms);
  auto o = options(table, "tick", "holder");
  o.stale_threshold = 3s;
  o.alert_threshold = 2s;
  o.heartbeat_interval = 100ms;
  RecordingSessionMutex holder(session->backend(), o);
  REQUIRE(holder.options().heartbeat_timeout == 100ms);
  holder.create_schema();
  auto guard = holder.try_acquire();
  REQUIRE(guard);
  const auto before = session->stats();
  std::this_thread::sleep_for(5s);  // > the lease (2.7 s)
  const auto after = session->stats();
  const auto beats = after.heartbeats - before.heartbeats;
  std::printf("tick 100 ms, heartbeat timeout 100 ms: %llu heartbeats sent in 5 s, %zu failed, lost: %s\n",
              static_cast<unsigned long long>(beats), holder.metrics().count("heartbeat_failed"),
              guard.lost() ? "yes" : "no");
  CHECK_FALSE(guard.lost());
  CHECK(holder.held());
  CHECK(beats >= 20);  // one per interval and wait: about 30
  CHECK(holder.metrics().count("heartbeat_failed") == 0);
  guard.release();
}

namespace {

// A login role with one setting of its own (ALTER ROLE ... SET), the lock
// table's privileges, and nothing else; dropped at the end.
struct RoleWith {
  std::string name;
  RoleWith(const std::string& table, const std::string& setting) : name(fresh_table("role")) {
    admin("CREATE ROLE " + name + " LOGIN");
    admin("ALTER ROLE " + name + " SET " + setting);
    admin("GRANT SELECT, INSERT, UPDATE, DELETE ON " + table + ", " + table + "_queue TO " + name);
    admin("GRANT USAGE ON SEQUENCE " + table + "_fence_seq TO " + name);
  }
  RoleWith(const RoleWith&) = delete;
  RoleWith& operator=(const RoleWith&) = delete;
  ~RoleWith() {
    try {
      admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '" + name + "'");
      admin("DROP OWNED BY " + name);
      admin("DROP ROLE " + name);
    } catch (...) {  // a role left behind costs nothing
    }
  }
};

}  // namespace

TEST_CASE("role settings: idle sessions closed, statement and idle-transaction timeouts, serializable: "
          "every lock keeps its lease",
          "[session][roles]") {
  // idle_session_timeout (300 ms) below the heartbeat interval (1 s): the
  // server closes every connection between two beats, so each beat meets a
  // new server session, where the unconfirmed asynchronous ones may be gone.
  // The first heartbeat after any reconnect is durable, and counts alone.
  const std::string table = fresh_table("session_roles");
  REQUIRE(PostgresBackend("").create_schema(table));
  const std::vector<std::string> settings = {"idle_session_timeout = '300ms'", "statement_timeout = '20ms'",
                                             "idle_in_transaction_session_timeout = '10ms'",
                                             "default_transaction_isolation = 'serializable'"};
  // Lease 2.5 s: an untrusted beat shows within the 5 s held.
  const auto opts = [&](const std::string& lock) {
    auto o = options(table, lock, "holder");
    o.heartbeat_interval = 1s;
    o.alert_threshold = 3s;
    o.stale_threshold = 4s;
    return o;
  };
  constexpr int per_session = 3;
  struct Held {
    std::unique_ptr<RoleWith> role;
    std::shared_ptr<Session> session;
    std::unique_ptr<RecordingMutex> plain;
    std::optional<RecordingMutex::guard_type> plain_guard;
    std::vector<RecordingSessionMutex> shared;
    std::vector<RecordingSessionMutex::guard_type> shared_guards;
  };
  std::vector<Held> held(settings.size());
  for (std::size_t r = 0; r < settings.size(); ++r) {
    Held& h = held[r];
    h.role = std::make_unique<RoleWith>(table, settings[r]);
    const std::string dsn = "user=" + h.role->name;
    pgmutex::PostgresOptions po;
    REQUIRE(po.heartbeat_synchronous_commit_off);  // the default: heartbeats commit asynchronously
    h.plain = std::make_unique<RecordingMutex>(PostgresBackend(dsn, po), opts("plain" + std::to_string(r)));
    h.plain_guard.emplace(h.plain->try_acquire());
    REQUIRE(*h.plain_guard);
    h.session = Session::create(dsn);
    h.shared.reserve(per_session);  // a guard's mutex never moves
    for (int i = 0; i < per_session; ++i) {
      h.shared.emplace_back(h.session->backend(), opts("shared" + std::to_string(r) + "_" + std::to_string(i)));
      h.shared_guards.push_back(h.shared.back().try_acquire());
      REQUIRE(h.shared_guards.back());
    }
  }
  std::vector<pgmutex::SessionStats> before;
  for (const Held& h : held) before.push_back(h.session->stats());
  std::this_thread::sleep_for(5s);
  for (std::size_t r = 0; r < settings.size(); ++r) {
    Held& h = held[r];
    const auto after = h.session->stats();
    int shared_lost = 0;
    for (const auto& g : h.shared_guards) shared_lost += g.lost() ? 1 : 0;
    std::printf("role with %s: plain Mutex %zu heartbeats (%zu failed), lost: %s; session: %llu heartbeats, "
                "%llu connects, %d of %d locks lost\n",
                settings[r].c_str(), h.plain->metrics().count("heartbeat_latency"),
                h.plain->metrics().count("heartbeat_failed"), h.plain_guard->lost() ? "yes" : "no",
                static_cast<unsigned long long>(after.heartbeats - before[r].heartbeats),
                static_cast<unsigned long long>(after.connects), shared_lost, per_session);
    INFO(settings[r]);
    CHECK_FALSE(h.plain_guard->lost());
    CHECK(h.plain->metrics().count("lost") == 0);
    CHECK(h.plain->metrics().count("heartbeat_latency") >= 3);
    CHECK(shared_lost == 0);
    CHECK(after.heartbeats - before[r].heartbeats >= 3 * per_session);
    if (r == 0) CHECK(after.connects >= 3);  // the server did close the idle connections
  }
  for (Held& h : held) {
    CHECK(h.plain_guard->release(pgmutex::nothrow));
    for (auto& g : h.shared_guards) CHECK(g.release(pgmutex::nothrow));
  }
}

TEST_CASE("the connection drops between a waiter's LISTEN and its read: it listens again, wakes on the release",
          "[session][reconnect][listen]") {
  const std::string table = fresh_table("session_lost_listen");
  const std::string tag = fresh_tag("pgmutex_lost_listen");
  PostgresBackend holder("");
  REQUIRE(holder.create_schema(table));
  auto held = holder.try_acquire(request(table, "w", "first"));
  REQUIRE((held && held->acquired));

  FaultProxy proxy;
  auto session = Session::create(proxy.dsn() + " application_name=" + tag);
  REQUIRE(session->options().recheck_interval == 30s);
  REQUIRE(session->connect());
  // The default thresholds (stale 600 s): no stale deadline wakes the waiter meanwhile.
  SessionMutex waiter(session->backend(), options(table, "w", "waiter"));
  // The proxy forwards the waiter's try and its LISTEN, then drops the
  // connection (RST) as the read of the row goes out: the read is retried on
  // a fresh connection, which has no LISTEN.
  proxy.set("drop-after-listen");
  std::atomic<bool> got{false};
  std::atomic<std::chrono::steady_clock::rep> got_at{0};
  Crew crew;
  crew.threads.emplace_back([&] {
    auto g = waiter.acquire(20s, crew.stop.get_token());
    if (!g) return;
    got_at = std::chrono::steady_clock::now().time_since_epoch().count();
    got = true;
    (void)g.release(pgmutex::nothrow);
  });
  REQUIRE(poll_until([&] { return proxy.mode() == "pass"; }, 10s));  // the drop happened
  REQUIRE(poll_until([&] { return session->stats().connects >= 2; }, 10s));
  std::this_thread::sleep_for(500ms);  // the waiter waits (registered on the fresh connection)
  CHECK_FALSE(got.load());
  CHECK(connections_named(tag) == 1);

  const auto released_at = std::chrono::steady_clock::now();
  REQUIRE(holder.release(HolderKey{{table, "w"}, "first", held->fence, 7}));
  const bool woke = poll_until([&] { return got.load(); }, 10s);
  const auto latency = woke ? std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(got_at.load())) -
                                  released_at
                            : std::chrono::steady_clock::now() - released_at;
  std::printf("LISTEN lost before the waiter's read: woke %.3f s after the release%s (re-check every 30 s); "
              "%llu connects, %llu notifications\n",
              std::chrono::duration<double>(latency).count(), woke ? "" : " (not yet: gave up)",
              static_cast<unsigned long long>(session->stats().connects),
              static_cast<unsigned long long>(session->stats().notifications));
  CHECK(woke);
  CHECK(latency < 5s);
  CHECK(session->stats().notifications >= 1);  // woken by the NOTIFY, on the fresh LISTEN
}
