// Singletons (the seed's @mutex.singleton and singleton_async) and the async
// API's set-up, on the in-memory backend so that it runs anywhere: an Asio
// mutex is given its loop (AsioExecutor), the table is made with
// async_create_schema, a job runs under the mutex's lock or under a lock
// name given per call, blocking or as a coroutine, and a lost lease's
// release needs no try/catch. With Postgres, the same calls work on
// pgmutex::AsioMutex(session->backend(), options, {}, {}, AsioExecutor(io.get_executor())).
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <pgmutex/any_mutex.hpp>
#include <pgmutex/asio/executor.hpp>
#include <pgmutex/memory_backend.hpp>

namespace asio = boost::asio;
using namespace std::chrono_literals;

// AsioMutex's policies over the in-memory backend.
using MemoryAsioMutex =
    pgmutex::BasicMutex<pgmutex::MemoryBackend, pgmutex::SteadyClock, pgmutex::NoMetrics, pgmutex::AsioExecutor>;

int main() {
  auto server = pgmutex::MemoryServer::create();  // real time; tests use MemoryServer::create(ManualExecutor)
  asio::io_context io;

  // The executor is the fifth argument: an Asio mutex needs its loop.
  MemoryAsioMutex mutex(pgmutex::MemoryBackend(server), pgmutex::Options{.lock_name = "nightly-report-job"}, {}, {},
                        pgmutex::AsioExecutor(io.get_executor()));

  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
    failures += ok ? 0 : 1;
  };

  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        co_await mutex.async_create_schema(asio::use_awaitable);

        // A job under the mutex's own lock: runs only where the lock is acquired.
        auto report = mutex.async_singleton([]() -> asio::awaitable<int> { co_return 42; });
        std::optional<int> ran = co_await report(asio::use_awaitable);
        check(ran == 42, "async_singleton ran the coroutine under the mutex's lock");

        // Under a lock name given per call: the same backend and options.
        auto cleanup = mutex.async_singleton("nightly-cleanup", [](auto& guard) -> asio::awaitable<void> {
          std::printf("cleanup holds fence %lld\n", static_cast<long long>(guard.fence()));
          co_return;
        });
        check(co_await cleanup(asio::use_awaitable), "async_singleton ran under a lock name given per call");

        // Releasing a guard whose lease was lost is no error to catch.
        auto guard = co_await mutex.async_try_acquire(asio::use_awaitable);
        (void)pgmutex::MemoryBackend(server, "admin").force_release({"mutex_lock", "nightly-report-job"});
        (void)co_await guard.async_heartbeat(asio::as_tuple(asio::use_awaitable));  // finds the row gone
        const bool lost = guard.lost();
        co_await guard.async_release(asio::use_awaitable);
        check(lost, "a lost guard's async_release completed without an exception");
      },
      [&](std::exception_ptr e) {
        if (e) {
          std::printf("FAILED: the coroutine threw\n");
          ++failures;
        }
      });
  io.run();  // returns once the coroutine is done: nothing of pgmutex keeps the loop busy

  // Blocking singletons, also on AnyMutex; a refused lock name says why.
  pgmutex::AnyMutex any = std::move(mutex);
  auto weekly = any.singleton("weekly-report", [] { return 7; });
  check(weekly() == 7, "AnyMutex::singleton under a lock name given per call");
  auto refused = any.singleton(pgmutex::nothrow, std::string(65, 'x'), [] {});
  check(!refused, "a lock name of 65 characters is refused");
  if (!refused) std::printf("  %s\n", refused.error().detail.c_str());
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
