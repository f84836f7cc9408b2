// pgmutex::Session against a real server (scripts/with-postgres): a plain
// timed program, each figure printed on a line of its own.
//
//  (a) 1,000 locks on one session: statements per heartbeat round (one
//      heartbeat_async per lock, one tick), the round's time, the batch
//      statement's time, and 1,000 PostgresBackend::heartbeat calls in a loop;
//      over the unix socket, TCP to 127.0.0.1, and tests/tools/fault_proxy.py
//      (pass, then delay 1 ms; PGMUTEX_FAULT_PROXY names the script, default
//      relative to the source root: run from there); the server's WAL bytes
//      and transactions per round of each; and the unix socket again with the
//      table at fillfactor 100, as create_schema made it before;
//  (b) 100 idle waiters on one session: the database's committed
//      transactions per second (pg_stat_database.xact_commit) and connections;
//  (c) 10,000 SessionMutexes held on one session: one heartbeat round's time,
//      and the client's CPU seconds per second while they are held;
//  (d) handoff latency, release returned -> the waiter's acquire returned,
//      through Mutex (a connection each) and SessionMutex (one session).
//
// Run: scripts/with-postgres build/benchmarks/postgres/session_bench [a|b|c|d]...
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

#include "pgmutex/mutex.hpp"
#include "pgmutex/session.hpp"

#include "bench_link.hpp"

using namespace std::chrono_literals;
using pgmutex::AcquireRequest;
using pgmutex::BeatReply;
using pgmutex::HolderKey;
using pgmutex::LockRef;
using pgmutex::PostgresBackend;
using pgmutex::Session;
using pgmutex::SessionBackend;
using pgmutex::SessionMutex;
using pgmutex::WatchRequest;
using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

template <class T>
T need(pgmutex::Result<T> r, const char* what) {
  if (!r) throw std::runtime_error(std::string(what) + ": " + r.error().message());
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}
void need(pgmutex::Result<void> r, const char* what) {
  if (!r) throw std::runtime_error(std::string(what) + ": " + r.error().message());
}

long admin_long(const std::string& sql) {
  pqxx::connection c("");
  pqxx::nontransaction tx(c);
  return tx.exec(sql)[0][0].as<long>();
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// `n` locks taken through `backend`; their keys (views into `names`).
std::vector<HolderKey> hold(SessionBackend& backend, const std::string& table, std::vector<std::string>& names, int n) {
  std::vector<HolderKey> keys;
  names.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) names.push_back("lock-" + std::to_string(i));
  for (int i = 0; i < n; ++i) {
    auto won = need(backend.try_acquire(AcquireRequest{LockRef{table, names[static_cast<std::size_t>(i)]}, "me", 600s, 7}),
                    "acquire");
    if (!won.acquired) throw std::runtime_error("not acquired");
    keys.push_back(HolderKey{{table, names[static_cast<std::size_t>(i)]}, "me", won.fence, 7, 5s});
  }
  return keys;
}

// One heartbeat_async per key; returns once every answer came.
Clock::duration beat_round(SessionBackend& backend, const std::vector<HolderKey>& keys) {
  std::atomic<std::size_t> left{keys.size()};
  std::atomic<std::size_t> failed{0};
  std::promise<void> all;
  const auto started = Clock::now();
  for (const HolderKey& key : keys)
    backend.heartbeat_async(key, [&](BeatReply reply) {
      if (!reply.result) ++failed;
      if (--left == 0) all.set_value();
    });
  all.get_future().wait();
  const auto took = Clock::now() - started;
  if (failed != 0) throw std::runtime_error(std::to_string(failed.load()) + " heartbeats failed");
  return took;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One link's figures for (a): the 1,000 keys beaten `rounds` times as one
// heartbeat_async round, as one heartbeat_many, and as 1,000 single heartbeats.
// `admin` set: the server's WAL bytes and transactions per round of each, too.
void bench_a_link(const std::string& label, const std::string& dsn, const std::vector<HolderKey>& keys, int rounds,
                  pqxx::connection* admin) {
  auto session = Session::create(dsn);
  SessionBackend backend = session->backend();
  PostgresBackend single(dsn);
  need(single.connect(), "connect");
  const double rtt = bench::round_trip_ms(dsn);
  std::vector<double> round_ms, batch_ms, single_ms;
  bench::ServerMark cost[3] = {};  // round, batch, singles: summed over the rounds
  const auto count = [&](int which, auto&& work) {
    const auto before = admin ? bench::server_mark(*admin) : bench::ServerMark{};
    work();
    if (!admin) return;
    const auto after = bench::server_mark(*admin);
    cost[which].wal += after.wal - before.wal;
    cost[which].xid += after.xid - before.xid;
  };
  for (int r = 0; r < rounds; ++r) {
    // Heartbeat statements only: stats().statements notes a blocking
    // heartbeat_many (run on the caller's thread) at the I/O thread's next pass.
    const auto before = session->stats();
    count(0, [&] { round_ms.push_back(ms(beat_round(backend, keys))); });
    const auto after = session->stats();
    if (after.heartbeat_statements - before.heartbeat_statements != 1)
      std::printf("a: %s: round %d took %llu heartbeat statements\n", label.c_str(), r,
                  static_cast<unsigned long long>(after.heartbeat_statements - before.heartbeat_statements));
    count(1, [&] {
      const auto started = Clock::now();
      need(backend.heartbeat_many(keys), "heartbeat_many");
      batch_ms.push_back(ms(Clock::now() - started));
    });
    count(2, [&] {
      const auto started = Clock::now();
      for (const HolderKey& key : keys) need(single.heartbeat(key), "heartbeat");
      single_ms.push_back(ms(Clock::now() - started));
    });
  }
  const auto s = session->stats();
  std::printf("a: %s: %llu heartbeat statements for %llu heartbeats\n", label.c_str(),
              static_cast<unsigned long long>(s.heartbeat_statements), static_cast<unsigned long long>(s.heartbeats));
  const double tick = ms(session->options().heartbeat_tick);
  std::printf("a: %s: SELECT 1 round trip median %.3f ms; %d rounds\n", label.c_str(), rtt, rounds);
  std::printf("a: %s: heartbeat_async round (tick %.0f ms included): median %.2f ms\n", label.c_str(), tick,
              median(round_ms));
  std::printf("a: %s: one heartbeat_many of 1000 keys: median %.2f ms\n", label.c_str(), median(batch_ms));
  std::printf("a: %s: 1000 PostgresBackend::heartbeat in a loop: median %.2f ms\n", label.c_str(), median(single_ms));
  std::printf("a: %s: ratio loop / batch statement: %.1fx; loop / (round minus tick): %.1fx\n", label.c_str(),
              median(single_ms) / median(batch_ms), median(single_ms) / std::max(0.001, median(round_ms) - tick));
  if (admin)
    std::printf("a: %s: per round, server: heartbeat_async round %.0f transactions, %.0f WAL bytes; heartbeat_many "
                "%.0f transactions, %.0f WAL bytes; 1000 singles %.0f transactions, %.0f WAL bytes\n",
                label.c_str(), static_cast<double>(cost[0].xid) / rounds, static_cast<double>(cost[0].wal) / rounds,
                static_cast<double>(cost[1].xid) / rounds, static_cast<double>(cost[1].wal) / rounds,
                static_cast<double>(cost[2].xid) / rounds, static_cast<double>(cost[2].wal) / rounds);
}

void bench_a() {
  const std::string table = "bench_session_a";
  std::vector<std::string> names;
  std::vector<HolderKey> keys;
  auto owner = Session::create("");
  SessionBackend backend = owner->backend();
  need(backend.create_schema(table), "schema");
  keys = hold(backend, table, names, 1000);
  pqxx::connection admin("");
  const std::string tcp = "host=" + bench::env_or("PGMUTEX_TEST_TCP_HOST", "127.0.0.1");
  bench_a_link("unix socket", "", keys, 20, &admin);
  bench_a_link("tcp 127.0.0.1", tcp, keys, 20, nullptr);
  {
    bench::Proxy proxy;
    bench_a_link("fault_proxy pass", proxy.dsn(), keys, 10, nullptr);
    proxy.set("delay 1");
    bench_a_link("fault_proxy delay 1", proxy.dsn(), keys, 5, nullptr);
  }
  // The table as it was before create_schema set fillfactor 50: rewritten full.
  {
    pqxx::nontransaction tx(admin);
    tx.exec("ALTER TABLE " + table + " RESET (fillfactor)");
    tx.exec("VACUUM FULL " + table);
  }
  bench_a_link("unix socket, fillfactor 100 (as before)", "", keys, 20, &admin);
}

void bench_b() {
  const std::string table = "bench_session_b";
  const std::string tag = "pgmutex_bench_b";
  auto session = Session::create("application_name=" + tag);
  PostgresBackend holder("");
  need(holder.create_schema(table), "schema");
  auto held = need(holder.try_acquire(AcquireRequest{LockRef{table, "w"}, "holder", 600s, 7}), "acquire");
  if (!held.acquired) throw std::runtime_error("not acquired");
  constexpr int n = 100;
  std::stop_source stop;
  std::atomic<int> waiting{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&] {
      SessionBackend b = session->backend();
      ++waiting;
      while (!stop.stop_requested()) (void)b.wait_until_free(WatchRequest{{table, "w"}, 600s, std::nullopt}, 60s, stop.get_token());
    });
  while (waiting.load() < n) std::this_thread::sleep_for(10ms);
  // Registered; and the server flushes a backend's statistics up to 10 s after it went
  // idle (PGSTAT_IDLE_INTERVAL), so the registrations' own statements settle first.
  std::this_thread::sleep_for(12s);
  const std::string xacts = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
  const auto s0 = session->stats();
  const long x0 = admin_long(xacts);
  std::this_thread::sleep_for(10s);
  const long x1 = admin_long(xacts);
  const auto s1 = session->stats();
  const long conns = admin_long("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + tag + "'");
  stop.request_stop();
  for (auto& t : threads) t.join();
  // Each measuring query is one transaction of its own (the first counts in the delta).
  std::printf("b: 100 idle waiters for 10 s: %ld transactions committed in the database (%.2f/s, the measuring "
              "query's excluded), session statements %llu, rechecks %llu, connections of the session %ld\n",
              x1 - x0 - 1, static_cast<double>(x1 - x0 - 1) / 10.0,
              static_cast<unsigned long long>(s1.statements - s0.statements),
              static_cast<unsigned long long>(s1.rechecks - s0.rechecks), conns);
}

void bench_c() {
  const std::string table = "bench_session_c";
  auto session = Session::create("");
  {
    SessionBackend b = session->backend();
    need(b.create_schema(table), "schema");
  }
  constexpr int n = 10000;
  pgmutex::Options o;
  o.table = table;
  o.instance_id = "me";
  o.heartbeat_interval = 1s;
  o.stale_threshold = 60s;
  std::vector<SessionMutex> mutexes;
  std::vector<SessionMutex::guard_type> guards;
  mutexes.reserve(n);
  guards.reserve(n);
  const auto taking = Clock::now();
  for (int i = 0; i < n; ++i) {
    o.lock_name = "lock-" + std::to_string(i);
    mutexes.emplace_back(session->backend(), o);
    guards.push_back(mutexes.back().try_acquire());
    if (!guards.back()) throw std::runtime_error("not acquired: " + o.lock_name);
  }
  std::printf("c: 10000 SessionMutex acquired in %.1f s\n", std::chrono::duration<double>(Clock::now() - taking).count());
  // One round of their heartbeats, as one batch: the keys of all 10,000 grants.
  SessionBackend b = session->backend();
  const auto rows = need(b.list(table), "list");  // the grants as stored: fence and token
  std::vector<HolderKey> keys;
  for (const auto& row : rows) keys.push_back(HolderKey{{table, row.lock_name}, row.instance_id, row.fence, row.token, 10s});
  std::vector<double> rounds;
  for (int r = 0; r < 5; ++r) {
    const auto started = Clock::now();
    need(b.heartbeat_many(keys), "heartbeat_many");
    rounds.push_back(ms(Clock::now() - started));
  }
  std::sort(rounds.begin(), rounds.end());
  const auto s0 = session->stats();
  const double cpu0 = cpu_seconds();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(10s);
  const double cpu = cpu_seconds() - cpu0;
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto s1 = session->stats();
  std::size_t lost = 0;
  for (auto& g : guards) lost += g.lost() ? 1 : 0;
  std::printf("c: one heartbeat_many of 10000 keys: median %.1f ms (min %.1f)\n", rounds[rounds.size() / 2], rounds[0]);
  std::printf("c: holding 10000 (heartbeat_interval 1 s) for %.1f s: %.3f CPU s/s, %llu heartbeat statements, "
              "%llu heartbeats, %zu lost\n",
              wall, cpu / wall, static_cast<unsigned long long>(s1.heartbeat_statements - s0.heartbeat_statements),
              static_cast<unsigned long long>(s1.heartbeats - s0.heartbeats), lost);
  guards.clear();
}

// Two threads hand one lock back and forth `handoffs` times.
template <class MakeMutex>
void handoff(const char* label, MakeMutex make, int handoffs) {
  auto a = make("a");
  auto b = make("b");
  a.create_schema();
  std::atomic<Clock::time_point::rep> released_at{0};
  std::vector<double> latency;
  std::atomic<int> done{0};
  const auto side = [&](auto& self, bool first) {
    std::optional<typename std::remove_reference_t<decltype(self)>::guard_type> g;
    if (first) g.emplace(self.acquire());
    for (;;) {
      if (g) {
        std::this_thread::sleep_for(5ms);  // the other side is waiting by now
        if (done.load() >= handoffs) {
          g->release();
          done = handoffs + 1;
          return;
        }
        g->release();
        released_at = Clock::now().time_since_epoch().count();
        g.reset();
      }
      auto got = self.acquire(std::chrono::nanoseconds(10s));
      if (done.load() > handoffs) return;
      const auto now = Clock::now().time_since_epoch().count();
      latency.push_back(static_cast<double>(now - released_at.load()) / 1e6);
      ++done;
      g.emplace(std::move(got));
    }
  };
  std::thread ta([&] { side(a, true); });
  std::this_thread::sleep_for(200ms);
  std::thread tb([&] { side(b, false); });
  ta.join();
  tb.join();
  std::sort(latency.begin(), latency.end());
  std::printf("d: %s: %zu handoffs, release returned -> acquire returned: p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
              label, latency.size(), latency[latency.size() / 2], latency[latency.size() * 99 / 100], latency.back());
}

void bench_d() {
  const std::string table = "bench_session_d";
  pgmutex::Options o;
  o.table = table;
  o.lock_name = "handoff";
  o.stale_threshold = 60s;
  handoff("Mutex (own connections)", [&](const char* who) {
    auto x = o;
    x.instance_id = who;
    return pgmutex::Mutex(PostgresBackend(""), x);
  }, 200);
  auto session = Session::create("");
  handoff("SessionMutex (one session)", [&](const char* who) {
    auto x = o;
    x.instance_id = who;
    return SessionMutex(session->backend(), x);
  }, 200);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string which = "abcd";
    if (argc > 1) {
      which.clear();
      for (int i = 1; i < argc; ++i) which += argv[i];
    }
    if (which.find('a') != std::string::npos) bench_a();
    if (which.find('b') != std::string::npos) bench_b();
    if (which.find('c') != std::string::npos) bench_c();
    if (which.find('d') != std::string::npos) bench_d();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "session_bench: %s\n", e.what());
    return 1;
  }
}
