// AsioExecutor and the async API over the in-memory backend, in real time
// (the operations run on real threads): every completion token, timeouts,
// cancellation through a slot, lost leases. Orders are checked, never timings.
#include "pgmutex/asio/executor.hpp"  // first: the header is self-contained (asio.hpp adds the Postgres session)

#include <atomic>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>

#include "pgmutex/memory_backend.hpp"

using namespace pgmutex;
using namespace std::chrono_literals;
namespace asio = boost::asio;
using boost::system::error_code;

namespace {

using AsioMemoryMutex = BasicMutex<MemoryBackend, SteadyClock, NoMetrics, AsioExecutor>;
using Guard = AsioMemoryMutex::guard_type;

Options opts(std::string instance) {
  Options o;
  o.lock_name = "asio-job";
  o.instance_id = std::move(instance);
  o.poll_interval = 10ms;
  return o;
}

// An io_context run by one thread until the world goes.
struct World {
  std::shared_ptr<MemoryServer> server = MemoryServer::create();
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  AsioMemoryMutex a{MemoryBackend(server, "a"), opts("a"), {}, {}, AsioExecutor(io.get_executor())};
  AsioMemoryMutex b{MemoryBackend(server, "b"), opts("b"), {}, {}, AsioExecutor(io.get_executor())};
  std::thread runner;

  World() {
    a.create_schema();
    runner = std::thread([this] { io.run(); });
  }
  // Stopped, not drained: the work guard keeps it running (the wake-ups are not on it).
  ~World() {
    io.stop();
    runner.join();
  }
  std::optional<LockRow> row() { return MemoryBackend(server, "admin").inspect(LockRef{"mutex_lock", "asio-job"}).value(); }
};

}  // namespace

TEST_CASE("AsioExecutor: a cancelled task never runs; a due one runs off the user's loop, which need not run",
          "[asio]") {
  asio::io_context io;  // never run: the lease timer must not wait for it
  AsioExecutor executor(io.get_executor());
  STATIC_REQUIRE(Executor<AsioExecutor>);
  std::atomic<bool> cancelled_ran{false};
  std::promise<std::thread::id> ran_on;
  // Due before the witness (tasks run in due order), cancelled long before it is due.
  const TaskId doomed = executor.schedule_after(500ms, [&] { cancelled_ran = true; });
  (void)executor.schedule_after(600ms, [&] { ran_on.set_value(std::this_thread::get_id()); });
  executor.cancel(doomed);
  executor.cancel(12345);  // unknown: nothing
  auto ran = ran_on.get_future();
  REQUIRE(ran.wait_for(30s) == std::future_status::ready);  // with the loop never run
  const std::thread::id runner = ran.get();
  CHECK(runner != std::this_thread::get_id());
  CHECK_FALSE(cancelled_ran);
  CHECK(io.poll() == 0);  // nothing was queued on the loop
}

TEST_CASE("AsioExecutor: cancel waits for a task running on another thread", "[asio]") {
  asio::io_context io;
  AsioExecutor executor(io.get_executor());
  std::atomic<bool> started{false}, finished{false};
  const TaskId id = executor.schedule_after(0ns, [&] {
    started = true;
    std::this_thread::sleep_for(50ms);
    finished = true;
  });
  while (!started) std::this_thread::yield();
  executor.cancel(id);
  CHECK(finished);
}

TEST_CASE("async_try_acquire and async_release with callbacks", "[asio]") {
  World w;
  std::promise<std::pair<error_code, Guard>> got_a, got_b;
  w.a.async_try_acquire([&](error_code ec, Guard g) { got_a.set_value({ec, std::move(g)}); });
  auto [ec_a, ga] = got_a.get_future().get();
  CHECK_FALSE(ec_a);
  REQUIRE(ga);
  w.b.async_try_acquire([&](error_code ec, Guard g) { got_b.set_value({ec, std::move(g)}); });
  auto [ec_b, gb] = got_b.get_future().get();
  CHECK_FALSE(ec_b);  // taken by another is an answer, not an error
  CHECK_FALSE(gb);
  CHECK(gb.why() == Errc::lock_held);
  REQUIRE(gb.holder());
  CHECK(gb.holder()->instance_id == "a");

  std::promise<error_code> released;
  ga.async_release([&](error_code ec) { released.set_value(ec); });
  CHECK_FALSE(ga.owns_lock());  // the grant left the guard at once
  CHECK_FALSE(released.get_future().get());
  CHECK_FALSE(w.row());

  // A second acquire through one object while it holds: an error code.
  auto g1 = w.a.async_try_acquire(asio::use_future).get();
  REQUIRE(g1);
  std::promise<error_code> again;
  w.a.async_try_acquire([&](error_code ec, Guard) { again.set_value(ec); });
  CHECK(std::error_code(again.get_future().get()) == Errc::already_acquired);
}

TEST_CASE("use_future: the guard alone; async_heartbeat and async_release; use_awaitable throws an error", "[asio]") {
  World w;
  Guard g = w.a.async_try_acquire(asio::use_future).get();
  REQUIRE(g);
  g.async_heartbeat(asio::use_future).get();
  Guard taken = w.b.async_acquire(10ms, asio::use_future).get();
  CHECK_FALSE(taken);
  CHECK(taken.why() == Errc::timeout);
  REQUIRE(taken.holder());
  CHECK(taken.holder()->instance_id == "a");
  g.async_release(asio::use_future).get();
  // An error is thrown: caught inside a coroutine, on the loop's thread (an
  // exception handed across threads by a future is a false report of
  // ThreadSanitizer's, libstdc++'s exception_ptr being uninstrumented).
  Guard empty;
  auto caught = asio::co_spawn(
      w.io,
      [&]() -> asio::awaitable<error_code> {
        try {
          co_await empty.async_release(asio::use_awaitable);
        } catch (const boost::system::system_error& e) {
          co_return e.code();
        }
        co_return error_code();
      },
      asio::use_future);
  CHECK(std::error_code(caught.get()) == Errc::lock_not_held);
}

TEST_CASE("use_awaitable: a coroutine waits for the lock without a thread, and gets it when released", "[asio]") {
  World w;
  Guard held = w.a.try_acquire();
  REQUIRE(held);
  auto waiter = asio::co_spawn(
      w.io,
      [&]() -> asio::awaitable<Fence> {
        Guard g = co_await w.b.async_acquire(std::nullopt, asio::use_awaitable);
        co_await g.async_heartbeat(asio::use_awaitable);
        const Fence fence = g.fence();
        co_await g.async_release(asio::use_awaitable);
        co_return fence;
      },
      asio::use_future);
  // Most likely the waiter found it held and polls by now; either way the release lets it in.
  std::this_thread::sleep_for(30ms);
  const Fence first = held.fence();
  held.release();
  CHECK(waiter.get() == first + 1);
}

TEST_CASE("deferred: nothing runs until the operation is launched", "[asio]") {
  World w;
  auto later = w.a.async_try_acquire(asio::deferred);
  CHECK_FALSE(w.row());
  std::promise<Guard> got;
  std::move(later)([&](error_code ec, Guard g) {
    CHECK_FALSE(ec);
    got.set_value(std::move(g));
  });
  Guard g = got.get_future().get();
  REQUIRE(g);
  REQUIRE(w.row());
  CHECK(w.row()->instance_id == "a");
  auto release = g.async_release(asio::deferred);
  CHECK(w.row());
  std::move(release)(asio::use_future).get();
  CHECK_FALSE(w.row());
}

TEST_CASE("a cancelled async_acquire completes with operation_aborted and leaves no row behind", "[asio]") {
  World w;
  SECTION("while it waits for a holder") {
    Guard held = w.a.try_acquire();
    REQUIRE(held);
    asio::cancellation_signal signal;
    std::promise<std::pair<error_code, Guard>> got;
    w.b.async_acquire(std::nullopt, asio::bind_cancellation_slot(signal.slot(), [&](error_code ec, Guard g) {
                        got.set_value({ec, std::move(g)});
                      }));
    std::this_thread::sleep_for(30ms);  // (not needed for the outcome: cancelled before or while it waits)
    asio::post(w.io, [&] { signal.emit(asio::cancellation_type::terminal); });  // emitted on the handler's side
    auto [ec, g] = got.get_future().get();
    CHECK(ec == asio::error::operation_aborted);
    CHECK_FALSE(g);
    CHECK(g.why() == Errc::cancelled);
    held.release();
    std::this_thread::sleep_for(30ms);  // a waiter that were still polling would take it by now
    CHECK_FALSE(w.row());
  }
  SECTION("as its try wins the free lock: the grant is released, or the operation had won first") {
    for (int round = 0; round < 50; ++round) {
      asio::cancellation_signal signal;
      std::promise<std::pair<error_code, Guard>> got;
      asio::post(w.io, [&] {
        w.b.async_acquire(std::nullopt, asio::bind_cancellation_slot(signal.slot(), [&](error_code ec, Guard g) {
                            got.set_value({ec, std::move(g)});
                          }));
        signal.emit(asio::cancellation_type::terminal);
      });
      auto [ec, g] = got.get_future().get();
      if (ec) {
        CHECK(ec == asio::error::operation_aborted);
        CHECK_FALSE(w.row());
      } else {
        CHECK(g);
        REQUIRE(w.row());
        CHECK(w.row()->instance_id == "b");
      }
    }
  }
}

TEST_CASE("async_wait_lost completes when the row is taken away; cancelled, it completes with operation_aborted",
          "[asio]") {
  World w;
  Guard g = w.a.async_try_acquire(asio::use_future).get();
  REQUIRE(g);
  asio::cancellation_signal signal;
  std::promise<error_code> cancelled;
  g.async_wait_lost(asio::bind_cancellation_slot(signal.slot(), [&](error_code ec) { cancelled.set_value(ec); }));
  asio::post(w.io, [&] { signal.emit(asio::cancellation_type::terminal); });
  CHECK(cancelled.get_future().get() == asio::error::operation_aborted);

  auto lost = g.async_wait_lost(asio::use_future);
  (void)MemoryBackend(w.server, "admin").force_release(LockRef{"mutex_lock", "asio-job"});
  // The next heartbeat finds no row: the lease is lost.
  std::promise<error_code> beat;
  g.async_heartbeat([&](error_code ec) { beat.set_value(ec); });
  CHECK(std::error_code(beat.get_future().get()) == Errc::lock_not_held);
  lost.get();  // no exception: lost
  CHECK(g.lost());
  // An empty guard has nothing to lose.
  Guard empty;
  std::promise<error_code> none;
  empty.async_wait_lost([&](error_code ec) { none.set_value(ec); });
  CHECK(std::error_code(none.get_future().get()) == Errc::lock_not_held);
}

// Issue 16, item 2: a CPU-bound handler on a single-threaded io_context must
// not delay the lease deadline. Every heartbeat fails (the connection is
// partitioned) while a handler spins on the loop for 4 leases: the guard's
// stop token is stopped by the deadline, off the loop, while it still spins;
// async_wait_lost completes once the loop runs again. Only orders are
// checked (the deadline's slack is 3 leases).
TEST_CASE("a handler that spins past the lease: the stop token fires at the deadline, off the loop", "[asio]") {
  using Clock = std::chrono::steady_clock;
  World w;
  Options o = opts("spinner");
  o.heartbeat_interval = 100ms;
  o.alert_threshold = 800ms;
  o.stale_threshold = 1s;
  o.safety_margin = 500ms;  // a lease of 500 ms
  AsioMemoryMutex m{MemoryBackend(w.server, "spinner"), o, {}, {}, AsioExecutor(w.io.get_executor())};
  const auto lease = 500ms;
  Guard g = m.async_try_acquire(asio::use_future).get();
  REQUIRE(g);

  std::atomic<Clock::rep> stopped_at{0};
  std::atomic<bool> stopped_on_loop{false};
  std::thread::id loop_thread = w.runner.get_id();
  std::stop_callback on_stop(g.stop_token(), [&] {
    stopped_at = Clock::now().time_since_epoch().count();
    stopped_on_loop = std::this_thread::get_id() == loop_thread;
  });
  std::promise<std::pair<error_code, Clock::time_point>> lost;
  g.async_wait_lost([&](error_code ec) { lost.set_value({ec, Clock::now()}); });

  std::promise<void> spinning;
  std::atomic<Clock::rep> spin_until{Clock::time_point::max().time_since_epoch().count()};
  Clock::time_point spin_end;
  bool lost_seen_in_spin = false;
  asio::post(w.io, [&] {
    spinning.set_value();
    while (Clock::now().time_since_epoch().count() < spin_until.load()) {
    }
    lost_seen_in_spin = g.lost();
    spin_end = Clock::now();
  });
  spinning.get_future().wait();
  w.server->partition("spinner");  // from now on every heartbeat fails: the deadline comes
  const auto cut_at = Clock::now();
  spin_until = (cut_at + 4 * lease).time_since_epoch().count();

  auto [ec, lost_at] = lost.get_future().get();
  CHECK_FALSE(ec);
  const Clock::time_point stopped{Clock::duration(stopped_at.load())};
  REQUIRE(stopped_at.load() != 0);
  INFO("stop fired " << std::chrono::duration<double>(stopped - cut_at).count()
                     << " s after the cut (deadline by " << std::chrono::duration<double>(lease).count()
                     << " s), spin ended " << std::chrono::duration<double>(spin_end - cut_at).count()
                     << " s after, async_wait_lost completed "
                     << std::chrono::duration<double>(lost_at - spin_end).count() << " s after the spin");
  CHECK(stopped < spin_end);  // the deadline did not wait for the loop
  CHECK_FALSE(stopped_on_loop);
  CHECK(lost_seen_in_spin);   // read on the loop, the guard says lost once the deadline passed
  CHECK(lost_at >= spin_end);  // its handler runs on the loop
  CHECK(g.lost());
  w.server->heal("spinner");
}

TEST_CASE("the operation survives its mutex: moved or destroyed meanwhile", "[asio]") {
  World w;
  auto mutex = std::make_unique<AsioMemoryMutex>(MemoryBackend(w.server, "c"), opts("c"), SteadyClock{}, NoMetrics{},
                                                 AsioExecutor(w.io.get_executor()));
  auto pending = mutex->async_try_acquire(asio::use_future);
  mutex.reset();
  Guard g = pending.get();
  REQUIRE(g);
  CHECK(w.row()->instance_id == "c");
  g.release();
}

namespace {

// A memory backend that tells waiters of releases (as a Session's LISTEN
// would): every release through any of them wakes every watcher.
struct Watchers {
  std::mutex mutex;
  std::map<WatchId, std::function<void()>> pending;
  WatchId last = 0;
  int registered = 0;
  int cancelled = 0;
  std::optional<std::chrono::nanoseconds> last_stale_in;
};

class WatchingBackend : public MemoryBackend {
 public:
  WatchingBackend(std::shared_ptr<MemoryServer> server, std::string name, std::shared_ptr<Watchers> watchers)
      : MemoryBackend(std::move(server), std::move(name)), watchers_(std::move(watchers)) {}

  Result<void> release(const HolderKey& key) noexcept {
    auto released = MemoryBackend::release(key);
    std::map<WatchId, std::function<void()>> woken;
    {
      std::lock_guard lock(watchers_->mutex);
      woken.swap(watchers_->pending);
    }
    for (auto& [id, fn] : woken) fn();
    return released;
  }
  Result<WatchId> watch_async(const WatchRequest& watch, std::function<void()> woken) noexcept {
    std::lock_guard lock(watchers_->mutex);
    ++watchers_->registered;
    watchers_->last_stale_in = watch.holder_stale_in;
    watchers_->pending.emplace(++watchers_->last, std::move(woken));
    return watchers_->last;
  }
  bool cancel_watch(WatchId id) noexcept {
    std::lock_guard lock(watchers_->mutex);
    if (watchers_->pending.erase(id) == 0) return false;
    ++watchers_->cancelled;
    return true;
  }

 private:
  std::shared_ptr<Watchers> watchers_;
};
static_assert(BackendWatchesLocksAsynchronously<WatchingBackend>);

using WatchingMutex = BasicMutex<WatchingBackend, SteadyClock, NoMetrics, AsioExecutor>;

}  // namespace

TEST_CASE("async_acquire on a backend that watches locks waits for the release, not for a poll", "[asio]") {
  auto server = MemoryServer::create();
  auto watchers = std::make_shared<Watchers>();
  asio::io_context io;
  auto slow = [](std::string instance) {
    Options o = opts(std::move(instance));
    o.poll_interval = std::chrono::hours(1);  // only a watch can wake the waiter in time
    return o;
  };
  WatchingMutex holder(WatchingBackend(server, "h", watchers), slow("h"), {}, {}, AsioExecutor(io.get_executor()));
  WatchingMutex waiter(WatchingBackend(server, "w", watchers), slow("w"), {}, {}, AsioExecutor(io.get_executor()));
  holder.create_schema();
  auto held = holder.try_acquire();
  REQUIRE(held);

  std::promise<void> watching;
  std::promise<std::pair<error_code, WatchingMutex::guard_type>> got;
  asio::cancellation_signal signal;
  SECTION("the release wakes it") {
    waiter.async_acquire(std::nullopt, [&](error_code ec, WatchingMutex::guard_type g) {
      got.set_value({ec, std::move(g)});
    });
  }
  SECTION("cancelled while it watches: the watch is cancelled, no row") {
    waiter.async_acquire(std::nullopt, asio::bind_cancellation_slot(signal.slot(), [&](error_code ec,
                                                                                      WatchingMutex::guard_type g) {
                           got.set_value({ec, std::move(g)});
                         }));
  }
  std::thread loop([&] { io.run(); });
  for (;;) {  // until the waiter has tried once and watches
    {
      std::lock_guard lock(watchers->mutex);
      if (watchers->registered > 0) break;
    }
    std::this_thread::yield();
  }
  {
    std::lock_guard lock(watchers->mutex);
    REQUIRE(watchers->last_stale_in);
    CHECK(*watchers->last_stale_in <= slow("w").stale_threshold);
  }
  auto future = got.get_future();
  if (signal.slot().has_handler()) {
    asio::post(io, [&] { signal.emit(asio::cancellation_type::terminal); });
    auto [ec, g] = future.get();
    CHECK(ec == asio::error::operation_aborted);
    CHECK(watchers->cancelled == 1);
    held.release();
    CHECK_FALSE(MemoryBackend(server, "admin").inspect(LockRef{"mutex_lock", "asio-job"}).value());
  } else {
    held.release();
    auto [ec, g] = future.get();
    CHECK_FALSE(ec);
    CHECK(g);
    g.release();
  }
  io.stop();
  loop.join();
}

// Issue 20, friction 1: a program's io.run() returns once its work is done.
// Three mutexes on one loop (no work guard) with long thresholds: a 600 s
// stale threshold and a 60 s heartbeat interval. Each coroutine acquires,
// heartbeats and releases; run() must return long before any of those timers
// could fire (its bound, 30 s, is half the heartbeat interval), though the
// mutexes themselves outlive it.
TEST_CASE("io.run() returns when the last lock is released, whatever the thresholds", "[asio][exit]") {
  auto server = MemoryServer::create();
  asio::io_context io;
  auto patient = [](std::string instance) {
    Options o = opts(std::move(instance));
    o.lock_name = "exit-" + o.instance_id;
    o.heartbeat_interval = 60s;
    o.alert_threshold = 120s;
    o.stale_threshold = 600s;
    return o;
  };
  std::vector<std::unique_ptr<AsioMemoryMutex>> mutexes;
  for (std::string name : {"one", "two", "three"}) {
    mutexes.push_back(std::make_unique<AsioMemoryMutex>(MemoryBackend(server, name), patient(name), SteadyClock{},
                                                        NoMetrics{}, AsioExecutor(io.get_executor())));
  }
  mutexes.front()->create_schema();
  std::atomic<int> released{0};
  for (auto& mutex : mutexes) {
    asio::co_spawn(
        io,
        [&released, m = mutex.get()]() -> asio::awaitable<void> {
          Guard g = co_await m->async_acquire(5s, asio::use_awaitable);
          if (!g) co_return;
          co_await g.async_heartbeat(asio::use_awaitable);
          co_await g.async_release(asio::use_awaitable);
          ++released;
        },
        asio::detached);
  }
  auto ran = std::async(std::launch::async, [&] { io.run(); });
  const bool returned = ran.wait_for(30s) == std::future_status::ready;
  if (!returned) io.stop();  // so that the failure is reported, not a hang
  REQUIRE(returned);
  CHECK(released.load() == 3);
}

// Issue 20, friction 7: releasing a guard whose lease was lost is no error the
// caller must catch: a coroutine goes on past the release, under use_awaitable
// and detached alike. An empty guard's release is still lock_not_held (above).
TEST_CASE("async_release of a lost guard completes with success; the coroutine goes on", "[asio][lost]") {
  World w;
  std::promise<std::pair<bool, error_code>> went_on;
  asio::co_spawn(
      w.io,
      [&]() -> asio::awaitable<void> {
        Guard g = co_await w.a.async_try_acquire(asio::use_awaitable);
        (void)MemoryBackend(w.server, "admin").force_release(LockRef{"mutex_lock", "asio-job"});
        auto [beat] = co_await g.async_heartbeat(asio::as_tuple(asio::use_awaitable));  // finds the row gone
        const bool lost = g.lost();
        co_await g.async_release(asio::use_awaitable);  // no throw
        went_on.set_value({lost, beat});
      },
      asio::detached);
  auto [lost, beat] = went_on.get_future().get();
  CHECK(lost);
  CHECK(std::error_code(beat) == Errc::lock_not_held);
  // The blocking form keeps its documented answer for the same case.
  Guard g = w.a.try_acquire();
  REQUIRE(g);
  (void)MemoryBackend(w.server, "admin").force_release(LockRef{"mutex_lock", "asio-job"});
  auto released = g.release(nothrow);
  REQUIRE_FALSE(released);
  CHECK(released.error() == Errc::lock_not_held);
}

TEST_CASE("async_create_schema: every token; a backend failure is an error code", "[asio][schema]") {
  auto server = MemoryServer::create();
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  AsioMemoryMutex m{MemoryBackend(server, "m"), opts("m"), {}, {}, AsioExecutor(io.get_executor())};
  auto later = m.async_create_schema(asio::deferred);
  CHECK_FALSE(MemoryBackend(server, "admin").inspect(LockRef{"mutex_lock", "asio-job"}));  // no table yet: an error
  std::move(later)(asio::use_future).get();
  CHECK(MemoryBackend(server, "admin").inspect(LockRef{"mutex_lock", "asio-job"}));  // the table exists
  m.async_create_schema(asio::use_future).get();  // idempotent
  server->partition("m");
  std::promise<error_code> failed;
  m.async_create_schema([&](error_code ec) { failed.set_value(ec); });
  CHECK(std::error_code(failed.get_future().get()) == Errc::backend_unavailable);
  server->heal("m");
  work.reset();
  runner.join();
}

namespace {

// What one run of an async singleton completed with, read on the loop (an
// exception is turned into its message there, not handed across threads).
template <class Ran>
struct RunOutcome {
  std::string error;  // empty: none
  Ran ran{};
};

template <class Job>
auto run_job(Job& job, asio::cancellation_signal* signal = nullptr) {
  using Ran = typename Job::ran_type;
  auto done = std::make_shared<std::promise<RunOutcome<Ran>>>();
  auto handler = [done](std::exception_ptr e, Ran ran) {
    RunOutcome<Ran> out;
    out.ran = std::move(ran);
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        out.error = x.what();
      }
    }
    done->set_value(std::move(out));
  };
  if (signal != nullptr) job(asio::bind_cancellation_slot(signal->slot(), std::move(handler)));
  else job(std::move(handler));
  return done->get_future();
}

}  // namespace

// Issue 20, section 2: the seed's singleton_async, with completion tokens.
TEST_CASE("async_singleton runs a coroutine while the lock is held, under its own or a given lock name",
          "[asio][singleton]") {
  World w;
  auto fenced = w.a.async_singleton([&](Guard& g) -> asio::awaitable<Fence> {
    REQUIRE(w.row());
    CHECK(w.row()->instance_id == "a");
    co_return g.fence();
  });
  auto first = run_job(fenced).get();
  CHECK(first.error.empty());
  REQUIRE(first.ran);
  CHECK(*first.ran > 0);
  CHECK_FALSE(w.row());  // released after the run

  // use_awaitable: the result alone, in a coroutine.
  auto in_coroutine = asio::co_spawn(
      w.io, [&]() -> asio::awaitable<bool> { co_return (co_await fenced(asio::use_awaitable)).has_value(); },
      asio::use_future);
  CHECK(in_coroutine.get());

  // Held by another: not run (an empty result), no error.
  Guard held = w.b.try_acquire();
  REQUIRE(held);
  CHECK_FALSE(run_job(fenced).get().ran);
  held.release();

  // A lock name given per call: the mutex's instance id and table, another row.
  int runs = 0;
  auto other = w.a.async_singleton("other-job", [&]() -> asio::awaitable<void> {
    auto row = MemoryBackend(w.server, "admin").inspect(LockRef{"mutex_lock", "other-job"}).value();
    REQUIRE(row);
    CHECK(row->instance_id == "a");
    CHECK_FALSE(w.row());  // the mutex's own lock is not taken
    ++runs;
    co_return;
  });
  auto ran_other = run_job(other).get();
  CHECK(ran_other.error.empty());
  CHECK(ran_other.ran);
  CHECK(runs == 1);
  CHECK_FALSE(MemoryBackend(w.server, "admin").inspect(LockRef{"mutex_lock", "other-job"}).value());

  // Refused names: the nothrow form's error names the name and the rule; the other throws.
  auto refused = w.a.async_singleton(nothrow, "", [&]() -> asio::awaitable<void> { co_return; });
  REQUIRE_FALSE(refused);
  CHECK(refused.error().detail == "singleton lock name \"\" refused: lock_name must not be empty");
  CHECK_THROWS_AS(w.a.async_singleton(std::string(65, 'x'), [&]() -> asio::awaitable<void> { co_return; }),
                  InvalidArgumentError);

  // What fn throws comes through; the lock is released all the same.
  auto boom = w.a.async_singleton([&]() -> asio::awaitable<int> {
    throw std::runtime_error("job failed");
    co_return 1;
  });
  auto failed = run_job(boom).get();
  CHECK(failed.error == "job failed");
  CHECK_FALSE(w.row());
}

TEST_CASE("async_singleton: waiting per the WaitPolicy, a timeout, and a cancellation", "[asio][singleton]") {
  World w;
  Guard held = w.b.try_acquire();
  REQUIRE(held);
  int runs = 0;
  auto body = [&](std::stop_token stop) -> asio::awaitable<int> { co_return stop.stop_requested() ? -1 : ++runs; };

  auto impatient = w.a.async_singleton(body, WaitPolicy{.blocking = true, .timeout = 20ms});
  auto timed_out = run_job(impatient).get();
  CHECK(timed_out.error.empty());
  CHECK_FALSE(timed_out.ran);  // a timeout: not run, as the blocking singleton says it

  auto patient = w.a.async_singleton(body, WaitPolicy{.blocking = true});
  SECTION("the release lets it in") {
    auto waiting = run_job(patient);
    std::this_thread::sleep_for(30ms);  // (not needed for the outcome)
    held.release();
    auto got = waiting.get();
    CHECK(got.error.empty());
    CHECK(got.ran == std::optional<int>(1));
  }
  SECTION("cancelled while it waits: operation_aborted, not run, no row") {
    asio::cancellation_signal signal;
    auto waiting = run_job(patient, &signal);
    std::this_thread::sleep_for(30ms);  // (not needed for the outcome)
    asio::post(w.io, [&] { signal.emit(asio::cancellation_type::terminal); });
    auto got = waiting.get();
    CHECK_FALSE(got.error.empty());
    CHECK_FALSE(got.ran);
    CHECK(runs == 0);
    REQUIRE(w.row());
    CHECK(w.row()->instance_id == "b");
  }
}

TEST_CASE("async_campaign: the try that grants announces (one operation); a lost race waits, then leads",
          "[asio][election]") {
  using AsioMemoryElection = BasicElection<MemoryBackend, SteadyClock, NoMetrics, AsioExecutor>;
  World w;
  AsioMemoryElection first{MemoryBackend(w.server, "a"), opts("a"), {}, {}, AsioExecutor(w.io.get_executor())};
  AsioMemoryElection second{MemoryBackend(w.server, "b"), opts("b"), {}, {}, AsioExecutor(w.io.get_executor())};
  const LockRef lock{"mutex_lock", "asio-job"};
  MemoryBackend reader(w.server, "reader");

  const auto before = w.server->operations();
  auto lead = first.async_campaign("a-1", 1s, asio::use_future).get();
  REQUIRE(lead);
  CHECK(w.server->operations() - before == 1);  // the grant and its announcement: one operation
  const auto elected = reader.leader(lock, 60s).value();
  CHECK(elected.leading());
  CHECK(elected.term == lead.term());
  CHECK(elected.value == "a-1");

  auto waiting = second.async_campaign("b-1", 10s, asio::use_future);
  CHECK(waiting.wait_for(50ms) == std::future_status::timeout);
  lead.resign();
  auto next = waiting.get();
  REQUIRE(next);
  CHECK(next.term() > elected.term);
  const auto now = reader.leader(lock, 60s).value();
  CHECK(now.leading());
  CHECK(now.term == next.term());
  CHECK(now.value == "b-1");
  CHECK(now.change == elected.change + 2);  // vacated, then elected: announced once
}
