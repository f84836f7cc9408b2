// The Asio engine (AsioPqConnection, issue 8's foundation) against a real
// server (scripts/with-postgres): 1,000 held locks heartbeated
//
//  - as 1,000 single heartbeat statements, one round trip each;
//  - as one pipeline of those 1,000 statements, each its own transaction (a
//    sync after each, as a Session's batched heartbeats would send them);
//  - as one pipeline of them in one transaction (a single sync);
//  - as one heartbeat_many statement (the arrays of all 1,000 keys).
//
// Every form sends the backend's own statements (sql.hpp), synchronous_commit off.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "asio_pq_connection.hpp"
#include "pgmutex/mutex.hpp"
#include "sql.hpp"

using namespace std::chrono_literals;
namespace asio = boost::asio;
using pgmutex::AcquireRequest;
using pgmutex::LockRef;
using pgmutex::PostgresBackend;
using pgmutex::postgres_detail::AsioPqConnection;
using pgmutex::postgres_detail::Outcome;
using pgmutex::postgres_detail::PipelineSync;
using pgmutex::postgres_detail::PqStatement;
using pgmutex::postgres_detail::Rows;

namespace {

constexpr int locks = 1000;
const std::string table = "bench_asio_engine";

std::chrono::steady_clock::time_point in(std::chrono::milliseconds d) { return std::chrono::steady_clock::now() + d; }

// 1,000 locks held by "me", made once; each heartbeat's parameters.
struct Held {
  pgmutex::postgres_detail::TableStatements sql = pgmutex::postgres_detail::make_statements(table, true);
  std::vector<std::vector<std::string>> heartbeat_params;  // $1 lock, $2 instance, $3 fence, $4 token, $5 lock_timeout
  std::vector<std::string> many_params;                    // the same as arrays

  Held() {
    PostgresBackend b("");
    if (auto created = b.create_schema(table); !created) throw std::runtime_error(created.error().message());
    std::string names = "{", instances = "{", fences = "{", tokens = "{";
    for (int i = 0; i < locks; ++i) {
      const std::string name = "lock-" + std::to_string(i);
      auto won = b.try_acquire(AcquireRequest{LockRef{table, name}, "me", 600s});
      if (!won || !won->acquired) throw std::runtime_error("not acquired: " + name);
      const std::string fence = std::to_string(won->fence);
      heartbeat_params.push_back({name, "me", fence, "0", "5000"});
      const char* comma = i == 0 ? "" : ",";
      names += comma + name;
      instances += std::string(comma) + "me";
      fences += comma + fence;
      tokens += std::string(comma) + "0";
    }
    many_params = {names + "}", instances + "}", fences + "}", tokens + "}", "5000"};
  }
};

const Held& held() {
  static const Held h;
  return h;
}

// A connection with the heartbeat statements prepared.
struct Engine {
  asio::io_context ctx;
  AsioPqConnection connection{ctx.get_executor()};

  Engine() {
    const auto& sql = held().sql;
    bool ok = true;
    connection.async_connect("", in(10s), [&](boost::system::error_code ec) { ok = ok && !ec; });
    ctx.run();
    for (const auto* s : {&sql.heartbeat, &sql.heartbeat_many}) {
      ctx.restart();
      connection.async_prepare(s->name, s->sql, in(10s), [&](boost::system::error_code ec, Rows) { ok = ok && !ec; });
      ctx.run();
    }
    if (!ok) throw std::runtime_error("connect or prepare failed: " + connection.last_failure().message);
  }
};

void asio_single_heartbeats_1000(benchmark::State& state) {
  Engine e;
  const auto& h = held();
  for (auto _ : state) {
    for (const auto& params : h.heartbeat_params) {
      bool ok = false;
      e.ctx.restart();
      e.connection.async_exec_prepared(h.sql.heartbeat.name, params, in(10s),
                                       [&](boost::system::error_code ec, Rows rows) { ok = !ec && rows.affected == 1; });
      e.ctx.run();
      if (!ok) state.SkipWithError("heartbeat failed");
    }
  }
}
BENCHMARK(asio_single_heartbeats_1000)->UseRealTime()->Unit(benchmark::kMillisecond);

void pipeline(benchmark::State& state, PipelineSync sync) {
  Engine e;
  const auto& h = held();
  std::vector<PqStatement> statements;
  for (const auto& params : h.heartbeat_params) statements.push_back(PqStatement::prepared(h.sql.heartbeat.name, params));
  for (auto _ : state) {
    bool ok = false;
    e.ctx.restart();
    e.connection.async_pipeline(statements, sync, in(30s),
                                [&](boost::system::error_code ec, std::vector<Outcome<Rows>> results) {
                                  ok = !ec && results.size() == statements.size();
                                  for (const auto& r : results) ok = ok && r && r->affected == 1;
                                });
    e.ctx.run();
    if (!ok) state.SkipWithError("pipeline failed");
  }
}
void asio_pipeline_heartbeats_1000(benchmark::State& state) { pipeline(state, PipelineSync::after_each); }
void asio_pipeline_heartbeats_1000_one_transaction(benchmark::State& state) { pipeline(state, PipelineSync::once); }
BENCHMARK(asio_pipeline_heartbeats_1000)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(asio_pipeline_heartbeats_1000_one_transaction)->UseRealTime()->Unit(benchmark::kMillisecond);

void asio_heartbeat_many_1000(benchmark::State& state) {
  Engine e;
  const auto& h = held();
  for (auto _ : state) {
    bool ok = false;
    e.ctx.restart();
    e.connection.async_exec_prepared(h.sql.heartbeat_many.name, h.many_params, in(30s),
                                     [&](boost::system::error_code ec, Rows rows) { ok = !ec && rows.size() == locks; });
    e.ctx.run();
    if (!ok) state.SkipWithError("heartbeat_many failed");
  }
}
BENCHMARK(asio_heartbeat_many_1000)->UseRealTime()->Unit(benchmark::kMillisecond);

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
