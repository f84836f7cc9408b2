// PostgresBackend against a real server (scripts/with-postgres):
//
//  - an uncontended try-acquire plus release cycle through pgmutex::Mutex,
//    next to the same two prepared statements sent by plain libpq from this
//    program to the same server (goal: Mutex within 1.10x), and next to
//    pg_try_advisory_lock plus pg_advisory_unlock as a reference;
//  - a losing try, ours against the seed's single upsert
//    (INSERT … ON CONFLICT DO UPDATE … WHERE stale) with synchronous_commit on
//    (goal: at most 0.5x its time);
//  - a heartbeat with synchronous_commit off and on, and a 1,000-lock batched heartbeat.
#include <libpq-fe.h>

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "pgmutex/mutex.hpp"
#include "plain_libpq.hpp"
#include "sql.hpp"

using namespace std::chrono_literals;
using pgmutex::AcquireRequest;
using pgmutex::HolderKey;
using pgmutex::LockRef;
using pgmutex::PostgresBackend;

namespace {

// ---- plain libpq ------------------------------------------------------------

using bench::Pq;
using bench::setup_table;

pgmutex::Options options(const std::string& table, const std::string& lock) {
  pgmutex::Options o;
  o.table = table;
  o.lock_name = lock;
  return o;
}

// ---- the uncontended cycle -----------------------------------------------------

// Each cycle benchmark has its own table: the dead rows one leaves behind must not slow the other.
void mutex_cycle(benchmark::State& state) {
  setup_table("bench_cycle_mutex");
  pgmutex::Mutex mutex(PostgresBackend(""), options("bench_cycle_mutex", "job"));
  for (auto _ : state) {
    auto guard = mutex.try_acquire();
    if (!guard) state.SkipWithError("not acquired");
    guard.release();
  }
}
BENCHMARK(mutex_cycle)->UseRealTime();

void libpq_same_statements_cycle(benchmark::State& state) { bench::libpq_cycle(state, "bench_cycle_libpq", "postgres_cycle"); }
BENCHMARK(libpq_same_statements_cycle)->UseRealTime();

void advisory_lock_cycle(benchmark::State& state) {
  Pq pq;
  pq.prepare("lock", "SELECT pg_try_advisory_lock($1::bigint)");
  pq.prepare("unlock", "SELECT pg_advisory_unlock($1::bigint)");
  for (auto _ : state) {
    if (pq.run("lock", {"42"}) != "t") state.SkipWithError("not acquired");
    pq.run("unlock", {"42"});
  }
}
BENCHMARK(advisory_lock_cycle)->UseRealTime();

// ---- the losing try --------------------------------------------------------------

void mutex_losing_try(benchmark::State& state) {
  setup_table("bench_lose");
  PostgresBackend holder("");
  if (!holder.try_acquire(AcquireRequest{LockRef{"bench_lose", "job"}, "holder", 600s}))
    state.SkipWithError("holder failed");
  pgmutex::Mutex loser(PostgresBackend(""), options("bench_lose", "job"));
  for (auto _ : state) {
    auto guard = loser.try_acquire();
    if (guard) state.SkipWithError("won a held lock");
  }
}
BENCHMARK(mutex_losing_try)->UseRealTime();

void seed_upsert_losing_try(benchmark::State& state) {
  setup_table("bench_lose");
  PostgresBackend holder("");
  if (!holder.try_acquire(AcquireRequest{LockRef{"bench_lose", "job"}, "holder", 600s}))
    state.SkipWithError("holder failed");
  Pq pq;
  pq.exec("SET synchronous_commit = on");
  // The seed's shape: the existing row is locked before WHERE is checked.
  pq.prepare("upsert",
             "INSERT INTO bench_lose (lock_name, locked, instance_id, last_heartbeat, acquired_at)"
             " VALUES ($1, 1, $2, now(), now())"
             " ON CONFLICT (locked, lock_name) DO UPDATE SET instance_id = EXCLUDED.instance_id,"
             " last_heartbeat = now(), acquired_at = now()"
             " WHERE bench_lose.last_heartbeat < now() - interval '600 seconds' RETURNING fence");
  for (auto _ : state) {
    if (!pq.run("upsert", {"job", "seed"}).empty()) state.SkipWithError("won a held lock");
  }
}
BENCHMARK(seed_upsert_losing_try)->UseRealTime();

// ---- heartbeats ------------------------------------------------------------------------

void heartbeat(benchmark::State& state, bool synchronous_commit_off) {
  setup_table("bench_beat");
  pgmutex::PostgresOptions po;
  po.heartbeat_synchronous_commit_off = synchronous_commit_off;
  PostgresBackend b("", po);
  auto won = b.try_acquire(AcquireRequest{LockRef{"bench_beat", "job"}, "me", 600s});
  if (!won || !won->acquired) state.SkipWithError("not acquired");
  const HolderKey key{LockRef{"bench_beat", "job"}, "me", won ? won->fence : 0};
  for (auto _ : state) {
    if (!b.heartbeat(key)) state.SkipWithError("heartbeat failed");
  }
}
void heartbeat_synchronous_commit_off(benchmark::State& state) { heartbeat(state, true); }
void heartbeat_synchronous_commit_on(benchmark::State& state) { heartbeat(state, false); }
BENCHMARK(heartbeat_synchronous_commit_off)->UseRealTime();
BENCHMARK(heartbeat_synchronous_commit_on)->UseRealTime();

void heartbeat_many_1000(benchmark::State& state) {
  setup_table("bench_many");
  PostgresBackend b("");
  std::vector<std::string> names;
  for (int i = 0; i < 1000; ++i) names.push_back("lock-" + std::to_string(i));
  std::vector<HolderKey> keys;
  for (const std::string& name : names) {
    auto won = b.try_acquire(AcquireRequest{LockRef{"bench_many", name}, "me", 600s});
    if (!won || !won->acquired) {
      state.SkipWithError("not acquired");
      return;
    }
    keys.push_back(HolderKey{LockRef{"bench_many", name}, "me", won->fence});
  }
  for (auto _ : state) {
    auto held = b.heartbeat_many(keys);
    if (!held || held->size() != keys.size()) state.SkipWithError("batch failed");
  }
}
BENCHMARK(heartbeat_many_1000)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  for (const char* name : {"PGHOST", "PGPORT", "PGDATABASE"}) {
    if (std::getenv(name) == nullptr) {
      std::cerr << name << " is not set: these benchmarks need a server. Run them through scripts/with-postgres, e.g.\n"
                << "  scripts/with-postgres meson test -C <builddir> --benchmark --suite postgres --verbose\n";
      return 1;
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {
    std::cerr << "benchmark failed: " << e.what() << "\n";
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
