// A C++20 coroutine service on one io_context that holds three locks (three
// AsioMutexes on one Session: one connection) and runs a task under each; a task is cancelled when its lease is lost
// (async_wait_lost || the task, with Asio's awaitable operators). To show it,
// a second connection force-releases one lock, as an operator would with
// `pgmutex release --force`: that lock's next heartbeat finds no row, its
// lease is lost, and its task is cancelled while the two others run to the end.
// Exits 0 when exactly that happened.
// Usage: asio_service [DSN]   (or PGMUTEX_DSN; none: libpq's PG* environment)
#include <array>
#include <cstdio>
#include <cstdlib>
#include <latch>
#include <string>
#include <thread>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "pgmutex/asio.hpp"

namespace asio = boost::asio;
using namespace asio::experimental::awaitable_operators;
using namespace std::chrono_literals;

using LockMutex = pgmutex::AsioMutex;

// The work a lock protects: 40 steps of 50 ms. Returns the steps done.
asio::awaitable<int> run_task(const std::string& name, pgmutex::Fence fence) {
  asio::steady_timer step(co_await asio::this_coro::executor);
  int done = 0;
  for (; done < 40; ++done) {
    step.expires_after(50ms);
    co_await step.async_wait(asio::use_awaitable);  // where a cancellation lands
  }
  std::printf("%s: task finished its %d steps under fence %lld\n", name.c_str(), done, static_cast<long long>(fence));
  co_return done;
}

// Holds `mutex` while its task runs; true if the task ran to its end.
asio::awaitable<bool> hold_and_run(LockMutex& mutex, std::latch& all_held) {
  const std::string name(mutex.lock_name());
  auto [error, guard] = co_await mutex.async_acquire(10s, asio::as_tuple(asio::use_awaitable));
  all_held.count_down();
  if (!guard) {
    std::printf("%s: not acquired (%s)\n", name.c_str(), error ? error.message().c_str() : "held by another");
    co_return false;
  }
  // Whichever ends first cancels the other: a lost lease cancels the task.
  auto ended = co_await (guard.async_wait_lost(asio::use_awaitable) || run_task(name, guard.fence()));
  const bool finished = ended.index() == 1;
  if (!finished) std::printf("%s: lease lost, task cancelled\n", name.c_str());
  auto [ec] = co_await guard.async_release(asio::as_tuple(asio::use_awaitable));
  std::printf("%s: released (%s)\n", name.c_str(), ec ? ec.message().c_str() : "ok");
  co_return finished;
}

int main(int argc, char** argv) {
  const char* env = std::getenv("PGMUTEX_DSN");
  const std::string dsn = argc > 1 ? argv[1] : env != nullptr ? env : "";
  asio::io_context io;
  auto session = pgmutex::Session::create(dsn);  // heartbeats of all three go out as one statement per tick

  auto options = [](std::string lock) {
    pgmutex::Options o{.lock_name = std::move(lock), .table = "asio_service_locks"};
    o.heartbeat_interval = 200ms;  // short, so the loss shows within a second
    o.stale_threshold = 3s;
    o.alert_threshold = 2s;
    o.safety_margin = 1500ms;
    return o;
  };
  std::array<LockMutex, 3> mutexes{
      LockMutex(session->backend(), options("report"), {}, {}, pgmutex::AsioExecutor(io.get_executor())),
      LockMutex(session->backend(), options("billing"), {}, {}, pgmutex::AsioExecutor(io.get_executor())),
      LockMutex(session->backend(), options("cleanup"), {}, {}, pgmutex::AsioExecutor(io.get_executor()))};
  mutexes[0].create_schema();

  std::latch all_held(3);
  std::array<int, 3> outcome{-1, -1, -1};  // 1: finished, 0: cancelled
  for (std::size_t i = 0; i < mutexes.size(); ++i)
    asio::co_spawn(io, hold_and_run(mutexes[i], all_held), [&, i](std::exception_ptr error, bool finished) {
      outcome[i] = error ? -1 : finished ? 1 : 0;
    });
  std::thread loop([&] { io.run(); });

  // The operator's side, on another connection: take "billing" away.
  all_held.wait();
  pgmutex::PostgresBackend admin(dsn);
  auto removed = admin.force_release(pgmutex::LockRef{"asio_service_locks", "billing"});
  std::printf("operator: force-released billing (%s)\n", removed && *removed ? "row removed" : "no row");
  loop.join();

  const bool as_expected = outcome[0] == 1 && outcome[1] == 0 && outcome[2] == 1;
  std::printf("%llu connection(s) for the three locks\n", static_cast<unsigned long long>(session->stats().connects));
  std::printf("%s\n", as_expected ? "as expected: billing's task was cancelled, the others finished"
                                  : "NOT as expected");
  return as_expected ? 0 : 1;
}
