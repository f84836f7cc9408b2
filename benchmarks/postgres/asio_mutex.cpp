// The async API (pgmutex/asio.hpp) against a real server (scripts/with-postgres),
// on BasicMutex<PostgresBackend, ..., AsioExecutor>:
//
//  - an uncontended cycle, co_await async_try_acquire then co_await
//    async_release, in a coroutine on an io_context run by the benchmark's
//    thread, next to the same two prepared statements sent by plain libpq
//    (goal: within 1.10x), and next to the same mutex's blocking cycle;
//  - the handoff: a holder releases, a waiter's async_acquire completes. The
//    time from release() returning to the waiter's handler, p50 and p99: a
//    PostgresBackend waiter polls (its poll_interval bounds this), an
//    AsioMutex on a Session is woken by the release's NOTIFY;
//  - AsioMutex's cycle on a Session.
#include <libpq-fe.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "pgmutex/asio.hpp"
#include "pgmutex/memory_backend.hpp"
#include "plain_libpq.hpp"
#include "sql.hpp"

using namespace std::chrono_literals;
namespace asio = boost::asio;
using pgmutex::AsioExecutor;
using pgmutex::PostgresBackend;

namespace {

using PgAsioMutex = pgmutex::BasicMutex<PostgresBackend, pgmutex::SteadyClock, pgmutex::NoMetrics, AsioExecutor>;

using bench::Pq;
using bench::setup_table;

pgmutex::Options options(const std::string& table, const std::string& instance) {
  pgmutex::Options o;
  o.table = table;
  o.lock_name = "job";
  o.instance_id = instance;
  o.poll_interval = 2ms;
  return o;
}

// ---- the uncontended cycle -----------------------------------------------------

void asio_mutex_cycle(benchmark::State& state) {
  setup_table("bench_asio_cycle");
  asio::io_context io;
  PgAsioMutex mutex(PostgresBackend(""), options("bench_asio_cycle", "asio"), {}, {},
                    AsioExecutor(io.get_executor()));
  bool finished = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (auto _ : state) {
          auto guard = co_await mutex.async_try_acquire(asio::use_awaitable);
          if (!guard) state.SkipWithError("not acquired");
          co_await guard.async_release(asio::use_awaitable);
        }
      },
      [&](std::exception_ptr) { finished = true; });
  // Until the coroutine ends, not until the loop drains: the last grant's wake-up stays due for a while.
  while (!finished) io.run_one();
}
BENCHMARK(asio_mutex_cycle)->UseRealTime();

// The same mutex type through the blocking API on this thread: what the
// async forms add is the difference (the hops to the I/O pool and back).
void blocking_same_mutex_cycle(benchmark::State& state) {
  setup_table("bench_asio_cycle_blocking");
  asio::io_context io;
  PgAsioMutex mutex(PostgresBackend(""), options("bench_asio_cycle_blocking", "blocking"), {}, {},
                    AsioExecutor(io.get_executor()));
  for (auto _ : state) {
    auto guard = mutex.try_acquire();
    if (!guard) state.SkipWithError("not acquired");
    guard.release();
  }
}
BENCHMARK(blocking_same_mutex_cycle)->UseRealTime();

void libpq_same_statements_cycle(benchmark::State& state) { bench::libpq_cycle(state, "bench_asio_cycle_libpq", "asio_mutex"); }
BENCHMARK(libpq_same_statements_cycle)->UseRealTime();

// ---- the same two cycles on the in-memory backend: no I/O, so what is left
// is what the async forms add (a hop to the I/O pool and back per operation).

using MemoryAsioMutex = pgmutex::BasicMutex<pgmutex::MemoryBackend, pgmutex::SteadyClock, pgmutex::NoMetrics, AsioExecutor>;

void asio_memory_cycle(benchmark::State& state) {
  asio::io_context io;
  MemoryAsioMutex mutex(pgmutex::MemoryBackend(pgmutex::MemoryServer::create()), options("mutex_lock", "asio"), {}, {},
                        AsioExecutor(io.get_executor()));
  mutex.create_schema();
  bool finished = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (auto _ : state) {
          auto guard = co_await mutex.async_try_acquire(asio::use_awaitable);
          if (!guard) state.SkipWithError("not acquired");
          co_await guard.async_release(asio::use_awaitable);
        }
      },
      [&](std::exception_ptr) { finished = true; });
  while (!finished) io.run_one();
}
BENCHMARK(asio_memory_cycle)->UseRealTime();

void blocking_memory_cycle(benchmark::State& state) {
  asio::io_context io;
  MemoryAsioMutex mutex(pgmutex::MemoryBackend(pgmutex::MemoryServer::create()), options("mutex_lock", "blocking"), {},
                        {}, AsioExecutor(io.get_executor()));
  mutex.create_schema();
  for (auto _ : state) {
    auto guard = mutex.try_acquire();
    if (!guard) state.SkipWithError("not acquired");
    guard.release();
  }
}
BENCHMARK(blocking_memory_cycle)->UseRealTime();

// ---- the handoff ---------------------------------------------------------------

// Each iteration: the holder (blocking API, its own connection) holds the
// lock while the waiter's async_acquire waits on the loop; the holder
// releases and notes when release() returned; the waiter's handler notes
// when it ran, then releases so the holder can take it again.
template <class Waiter>
void measure_handoff(benchmark::State& state, asio::io_context& io, Waiter& waiter, const std::string& table) {
  PgAsioMutex holder(PostgresBackend(""), options(table, "holder"), {}, {}, AsioExecutor(io.get_executor()));
  using Clock = std::chrono::steady_clock;
  using Guard = typename Waiter::guard_type;
  std::vector<double> micros;
  for (auto _ : state) {
    auto held = holder.try_acquire();
    if (!held) {
      state.SkipWithError("holder not acquired");
      break;
    }
    std::promise<Clock::time_point> got;
    Guard won;
    waiter.async_acquire(std::nullopt, [&](boost::system::error_code ec, Guard g) {
      const auto at = Clock::now();
      if (ec || !g) state.SkipWithError("waiter not acquired");
      won = std::move(g);
      got.set_value(at);
    });
    std::this_thread::sleep_for(5ms);  // the waiter found it held and waits
    held.release();
    const auto released = Clock::now();
    const auto at = got.get_future().get();
    micros.push_back(std::chrono::duration<double, std::micro>(at - released).count());
    won.release();
  }
  std::sort(micros.begin(), micros.end());
  if (!micros.empty()) {
    state.counters["p50_us"] = micros[micros.size() / 2];
    state.counters["p99_us"] = micros[std::min(micros.size() - 1, micros.size() * 99 / 100)];
  }
}

// The user's loop on its own thread while the benchmark's thread holds and releases.
struct Loop {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::thread thread{[this] { io.run(); }};
  ~Loop() {
    io.stop();
    thread.join();
  }
};

// PostgresBackend: the waiter tries again every poll_interval (2 ms).
void asio_handoff_polling(benchmark::State& state) {
  setup_table("bench_asio_handoff");
  Loop loop;
  PgAsioMutex waiter(PostgresBackend(""), options("bench_asio_handoff", "waiter"), {}, {},
                     AsioExecutor(loop.io.get_executor()));
  measure_handoff(state, loop.io, waiter, "bench_asio_handoff");
}
BENCHMARK(asio_handoff_polling)->UseRealTime()->Iterations(300);

// AsioMutex on a Session: the waiter sleeps on the session's LISTEN and is
// woken by the release's NOTIFY (poll_interval an hour: no poll helps it).
void asio_handoff_session(benchmark::State& state) {
  setup_table("bench_asio_handoff_session");
  Loop loop;
  auto session = pgmutex::Session::create("");
  auto o = options("bench_asio_handoff_session", "waiter");
  o.poll_interval = std::chrono::hours(1);
  pgmutex::AsioMutex waiter(session->backend(), o, {}, {}, AsioExecutor(loop.io.get_executor()));
  measure_handoff(state, loop.io, waiter, "bench_asio_handoff_session");
}
BENCHMARK(asio_handoff_session)->UseRealTime()->Iterations(300);

// ---- AsioMutex on a Session: the uncontended cycle (each operation runs on
// the session's I/O thread, BackendRunsJobs: the loop hands it over, the
// handler comes back; before, a pool thread also handed each statement over).

void asio_session_cycle(benchmark::State& state) {
  setup_table("bench_asio_cycle_session");
  asio::io_context io;
  auto session = pgmutex::Session::create("");
  pgmutex::AsioMutex mutex(session->backend(), options("bench_asio_cycle_session", "session"), {}, {},
                           AsioExecutor(io.get_executor()));
  bool finished = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (auto _ : state) {
          auto guard = co_await mutex.async_try_acquire(asio::use_awaitable);
          if (!guard) state.SkipWithError("not acquired");
          co_await guard.async_release(asio::use_awaitable);
        }
      },
      [&](std::exception_ptr) { finished = true; });
  while (!finished) io.run_one();
}
BENCHMARK(asio_session_cycle)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
