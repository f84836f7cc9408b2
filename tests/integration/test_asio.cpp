// [asio]: the async API on a real server, through BasicMutex<PostgresBackend,
// ..., AsioExecutor> (AsioMutex's executor on the blocking backend; AsioMutex
// itself needs the Session implementation): every completion token, a
// cancelled waiter that leaves no row, a lease lost to a force-release, and
// the user's loop staying responsive while a statement hangs on a row lock,
// and AsioMutex under a handler that spins past the lease. Orders are
// checked; the only timings (the spin test's) have a margin of a second.
#include "pgmutex/asio.hpp"  // first: the header is self-contained

#include <algorithm>
#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include "support.hpp"

using namespace itest;
using pgmutex::AsioExecutor;
using pgmutex::Errc;
using pgmutex::LockRef;
using pgmutex::PostgresBackend;
namespace asio = boost::asio;
using boost::system::error_code;

namespace {

using PgAsioMutex = pgmutex::BasicMutex<PostgresBackend, pgmutex::SteadyClock, pgmutex::NoMetrics, AsioExecutor>;
using Guard = PgAsioMutex::guard_type;

static_assert(std::is_same_v<pgmutex::AsioMutex::executor_type, AsioExecutor>);

// Lease 1.5 s, a beat every 200 ms, a statement may take 0.5 s.
pgmutex::Options quick(std::string table, std::string instance) {
  auto o = options(std::move(table), "x", std::move(instance));
  o.heartbeat_interval = 200ms;
  o.alert_threshold = 2s;
  o.stale_threshold = 3s;
  o.safety_margin = 1500ms;
  o.heartbeat_timeout = 500ms;
  o.poll_interval = 20ms;
  return o;
}

// The user's loop, run by one thread; two mutexes on one lock.
// Another session holds lock 'x''s row (FOR UPDATE) from construction until
// release() or destruction: every heartbeat's UPDATE waits on it until its
// timeout and fails.
class RowLocker {
 public:
  explicit RowLocker(const std::string& table)
      : thread_([this, table] {
          pqxx::connection c("");
          pqxx::work tx(c);
          tx.exec("SELECT 1 FROM " + table + " WHERE lock_name = 'x' FOR UPDATE");
          locked_.set_value();
          finish_.get_future().wait();
          tx.abort();
        }) {
    locked_.get_future().wait();
  }
  RowLocker(const RowLocker&) = delete;
  RowLocker& operator=(const RowLocker&) = delete;
  ~RowLocker() { release(); }
  void release() {
    if (!thread_.joinable()) return;
    finish_.set_value();
    thread_.join();
  }

 private:
  std::promise<void> locked_, finish_;
  std::thread thread_;
};

struct World {
  std::string table = fresh_table("asio");
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  PgAsioMutex a{PostgresBackend(""), quick(table, "a"), {}, {}, AsioExecutor(io.get_executor())};
  PgAsioMutex b{PostgresBackend(""), quick(table, "b"), {}, {}, AsioExecutor(io.get_executor())};
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
  // The row as another connection sees it.
  std::optional<pgmutex::LockRow> row() const {
    PostgresBackend other("");
    return other.inspect(LockRef{table, "x"}).value();
  }
};

}  // namespace

TEST_CASE("async_try_acquire and async_release with callbacks", "[asio]") {
  World w;
  std::promise<std::pair<error_code, Guard>> got_a, got_b;
  w.a.async_try_acquire([&](error_code ec, Guard g) { got_a.set_value({ec, std::move(g)}); });
  auto [ec_a, ga] = got_a.get_future().get();
  CHECK_FALSE(ec_a);
  REQUIRE(ga);
  w.b.async_try_acquire([&](error_code ec, Guard g) { got_b.set_value({ec, std::move(g)}); });
  auto [ec_b, gb] = got_b.get_future().get();
  CHECK_FALSE(ec_b);
  CHECK_FALSE(gb);
  CHECK(gb.why() == Errc::lock_held);
  REQUIRE(gb.holder());
  CHECK(gb.holder()->instance_id == "a");
  std::promise<error_code> released;
  ga.async_release([&](error_code ec) { released.set_value(ec); });
  CHECK_FALSE(released.get_future().get());
  CHECK_FALSE(w.row());
}

TEST_CASE("use_future: guards, a timeout as an empty guard, heartbeat, release", "[asio]") {
  World w;
  Guard g = w.a.async_try_acquire(asio::use_future).get();
  REQUIRE(g);
  g.async_heartbeat(asio::use_future).get();
  Guard late = w.b.async_acquire(100ms, asio::use_future).get();
  CHECK_FALSE(late);
  CHECK(late.why() == Errc::timeout);
  g.async_release(asio::use_future).get();
  Guard mine = w.b.async_acquire(5s, asio::use_future).get();
  REQUIRE(mine);
  CHECK(mine.fence() > g.fence());
}

TEST_CASE("use_awaitable: a coroutine waits for the lock and gets it when released", "[asio]") {
  World w;
  Guard held = w.a.try_acquire();
  REQUIRE(held);
  auto waiter = asio::co_spawn(
      w.io,
      [&]() -> asio::awaitable<pgmutex::Fence> {
        Guard g = co_await w.b.async_acquire(std::nullopt, asio::use_awaitable);
        co_await g.async_heartbeat(asio::use_awaitable);
        const auto fence = g.fence();
        co_await g.async_release(asio::use_awaitable);
        co_return fence;
      },
      asio::use_future);
  std::this_thread::sleep_for(100ms);  // most likely waiting by now; the outcome is the same either way
  const auto first = held.fence();
  held.release();
  CHECK(waiter.get() > first);
  CHECK_FALSE(w.row());
}

TEST_CASE("deferred: launched later, completes the same", "[asio]") {
  World w;
  auto later = w.a.async_try_acquire(asio::deferred);
  CHECK_FALSE(w.row());
  Guard g = std::move(later)(asio::use_future).get();
  REQUIRE(g);
  CHECK(w.row()->instance_id == "a");
  auto release = g.async_release(asio::deferred);
  std::move(release)(asio::use_future).get();
  CHECK_FALSE(w.row());
}

TEST_CASE("a cancelled waiting async_acquire leaves no row behind", "[asio]") {
  World w;
  Guard held = w.a.try_acquire();
  REQUIRE(held);
  asio::cancellation_signal signal;
  std::promise<std::pair<error_code, Guard>> got;
  w.b.async_acquire(std::nullopt, asio::bind_cancellation_slot(signal.slot(), [&](error_code ec, Guard g) {
                      got.set_value({ec, std::move(g)});
                    }));
  std::this_thread::sleep_for(100ms);
  asio::post(w.io, [&] { signal.emit(asio::cancellation_type::terminal); });
  auto [ec, g] = got.get_future().get();
  CHECK(ec == asio::error::operation_aborted);
  CHECK_FALSE(g);
  held.release();
  std::this_thread::sleep_for(200ms);  // ten poll intervals: a waiter still polling would hold it now
  CHECK_FALSE(w.row());
}

TEST_CASE("async_wait_lost completes when another backend force-releases the row", "[asio]") {
  World w;
  Guard g = w.a.async_try_acquire(asio::use_future).get();
  REQUIRE(g);
  auto lost = asio::co_spawn(
      w.io, [&]() -> asio::awaitable<void> { co_await g.async_wait_lost(asio::use_awaitable); }, asio::use_future);
  PostgresBackend admin("");
  REQUIRE(admin.force_release(LockRef{w.table, "x"}).value());
  lost.get();  // the next automatic heartbeat found no row
  CHECK(g.lost());
  CHECK(g.stop_token().stop_requested());
}

TEST_CASE("the user's loop stays responsive while a statement waits on a row lock", "[asio]") {
  World w;
  Guard g = w.a.async_try_acquire(asio::use_future).get();
  REQUIRE(g);
  // Another session locks the row: the heartbeat's UPDATE waits on it until its timeout.
  RowLocker blocker(w.table);

  // A 10 ms tick on the loop, counted until the hung heartbeat completes.
  std::atomic<int> ticks{0};
  std::atomic<bool> beat_done{false};
  std::promise<void> ticks_over;
  asio::steady_timer tick(w.io);
  std::function<void()> arm = [&] {
    tick.expires_after(10ms);
    tick.async_wait([&](error_code ec) {
      if (ec) return;
      if (beat_done) return ticks_over.set_value();
      ++ticks;
      arm();
    });
  };
  std::promise<std::pair<error_code, int>> beat;
  asio::post(w.io, [&] {
    arm();
    g.async_heartbeat([&](error_code ec) {
      beat_done = true;
      beat.set_value({ec, ticks.load()});
    });
  });
  auto [ec, ticks_meanwhile] = beat.get_future().get();
  ticks_over.get_future().wait();
  blocker.release();
  INFO("heartbeat: " << ec.message());
  INFO("ticks while it waited: " << ticks_meanwhile);
  CHECK(ec);                    // it gave up on the row lock
  CHECK(ticks_meanwhile >= 1);  // the loop ran timers while the statement waited: it was not on the loop
}

// ---- AsioMutex: the same API on one Session (one connection, one LISTEN) ----

namespace {

// Two AsioMutexes on one session, one on another: a waiter sleeps on the
// session's LISTEN (poll_interval an hour: only a NOTIFY, the holder's
// stale deadline or a re-check can wake it in time).
struct SessionWorld {
  std::string table = fresh_table("asio_session");
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::shared_ptr<pgmutex::Session> one = pgmutex::Session::create("");
  std::shared_ptr<pgmutex::Session> two = pgmutex::Session::create("");
  pgmutex::AsioMutex a{one->backend(), slow(table, "a"), {}, {}, AsioExecutor(io.get_executor())};
  pgmutex::AsioMutex b{one->backend(), slow(table, "b"), {}, {}, AsioExecutor(io.get_executor())};
  pgmutex::AsioMutex c{two->backend(), slow(table, "c"), {}, {}, AsioExecutor(io.get_executor())};
  std::thread runner;

  static pgmutex::Options slow(std::string table, std::string instance) {
    auto o = quick(std::move(table), std::move(instance));
    o.poll_interval = std::chrono::hours(1);
    return o;
  }
  SessionWorld() {
    a.create_schema();
    runner = std::thread([this] { io.run(); });
  }
  ~SessionWorld() {
    io.stop();
    runner.join();
  }
  std::optional<pgmutex::LockRow> row() const {
    PostgresBackend other("");
    return other.inspect(LockRef{table, "x"}).value();
  }
};

}  // namespace

TEST_CASE("AsioMutex on a Session: a coroutine waiter wakes on the release's NOTIFY", "[asio][session]") {
  SessionWorld w;
  const bool same_session = GENERATE(true, false);
  INFO((same_session ? "holder and waiter on one session" : "on two sessions"));
  pgmutex::AsioMutex& waiter = same_session ? w.b : w.c;
  auto held = w.a.async_try_acquire(asio::use_future).get();
  REQUIRE(held);
  auto got = asio::co_spawn(
      w.io,
      [&]() -> asio::awaitable<pgmutex::Fence> {
        auto g = co_await waiter.async_acquire(30s, asio::use_awaitable);
        const auto fence = g ? g.fence() : 0;
        if (g) co_await g.async_release(asio::use_awaitable);
        co_return fence;
      },
      asio::use_future);
  std::this_thread::sleep_for(200ms);  // most likely watching by now; the outcome is the same either way
  const auto first = held.fence();
  held.async_release(asio::use_future).get();
  CHECK(got.get() > first);  // woken long before an hour's poll, or it would time out the test
  CHECK_FALSE(w.row());
}

TEST_CASE("AsioMutex on a Session: a cancelled watching waiter leaves no row; a lost lease is told",
          "[asio][session]") {
  SessionWorld w;
  auto held = w.a.async_try_acquire(asio::use_future).get();
  REQUIRE(held);
  asio::cancellation_signal signal;
  std::promise<error_code> cancelled;
  w.c.async_acquire(std::nullopt, asio::bind_cancellation_slot(signal.slot(), [&](error_code ec, auto) {
                      cancelled.set_value(ec);
                    }));
  std::this_thread::sleep_for(200ms);
  asio::post(w.io, [&] { signal.emit(asio::cancellation_type::terminal); });
  CHECK(cancelled.get_future().get() == asio::error::operation_aborted);

  auto lost = held.async_wait_lost(asio::use_future);
  PostgresBackend admin("");
  REQUIRE(admin.force_release(LockRef{w.table, "x"}).value());
  lost.get();  // a batched heartbeat of the session found no row
  CHECK(held.lost());
  std::this_thread::sleep_for(200ms);  // the cancelled waiter, were it still watching, would take it now
  CHECK_FALSE(w.row());
}

TEST_CASE("AsioMutex on two Sessions waits in line: arrival order, no statement while in line; a cancelled "
          "and a timed-out waiter leave no place",
          "[asio][session][queue]") {
  SessionWorld w;
  // A holder on a connection of its own, without heartbeats: the sessions'
  // statements are then the waiters' alone.
  PostgresBackend admin("");
  pgmutex::AcquireRequest hold{LockRef{w.table, "x"}, "holder", 60s};
  hold.token = 7;
  auto held = admin.try_acquire(hold);
  REQUIRE((held && held->acquired));
  const auto queued = [&] {
    auto rows = admin.list_queue(w.table);
    REQUIRE(rows);
    return rows->size();
  };
  const auto in_line = [&](const std::string& instance) {
    auto rows = admin.list_queue(w.table);
    REQUIRE(rows);
    return std::any_of(rows->begin(), rows->end(), [&](const auto& r) { return r.instance_id == instance; });
  };
  const auto poll_until = [](const auto& ready) {
    for (int i = 0; i < 2000; ++i) {
      if (ready()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  };
  // Thresholds long enough that no waiter looks at the holder meanwhile.
  const auto line_options = [&](int i) {
    auto o = SessionWorld::slow(w.table, "q" + std::to_string(i));
    o.alert_threshold = 20s;
    o.stale_threshold = 30s;
    return o;
  };
  constexpr int n = 10;
  std::vector<std::unique_ptr<pgmutex::AsioMutex>> waiters;
  std::mutex m;
  std::vector<std::pair<int, pgmutex::Fence>> turns;
  std::vector<error_code> ends(n);
  std::atomic<int> finished{0};
  asio::cancellation_signal cancel_three;
  for (int i = 0; i < n; ++i) {
    auto& session = i % 2 == 0 ? w.one : w.two;
    waiters.emplace_back(
        new pgmutex::AsioMutex{session->backend(), line_options(i), {}, {}, AsioExecutor(w.io.get_executor())});
    auto done = [&, i](error_code ec, pgmutex::AsioMutex::guard_type g) {
      ends[static_cast<std::size_t>(i)] = ec;
      if (!ec && g) {
        {
          std::lock_guard lock(m);
          turns.emplace_back(i, g.fence());
        }
        g.async_release([&](error_code) { ++finished; });
      } else {
        ++finished;
      }
    };
    const std::optional<std::chrono::nanoseconds> timeout =
        i == 6 ? std::optional<std::chrono::nanoseconds>(1s) : std::optional<std::chrono::nanoseconds>(60s);
    if (i == 3) waiters.back()->async_acquire(timeout, asio::bind_cancellation_slot(cancel_three.slot(), done));
    else waiters.back()->async_acquire(timeout, done);
    REQUIRE(poll_until([&] { return in_line("q" + std::to_string(i)); }));
  }
  const auto statements = [&] {
    std::uint64_t sum = 0;
    for (const auto& s : {w.one, w.two}) sum += s->stats().statements - s->stats().heartbeat_statements;
    return sum;
  };
  REQUIRE(poll_until([&] { return finished.load() == 1; }));  // waiter 6 timed out
  CHECK(queued() == n - 1);
  const auto idle_from = statements();
  std::this_thread::sleep_for(1s);
  CHECK(statements() - idle_from == 0);  // nobody in line makes a statement

  asio::post(w.io, [&] { cancel_three.emit(asio::cancellation_type::terminal); });
  REQUIRE(poll_until([&] { return finished.load() == 2; }));
  CHECK(queued() == n - 2);
  CHECK(ends[3] == asio::error::operation_aborted);

  REQUIRE(admin.release(pgmutex::HolderKey{LockRef{w.table, "x"}, "holder", held->fence, 7}));
  REQUIRE(poll_until([&] { return finished.load() == n; }));
  CHECK(queued() == 0);
  CHECK_FALSE(w.row());
  std::lock_guard lock(m);
  REQUIRE(turns.size() == n - 2);
  int expected = 0;
  pgmutex::Fence last = held->fence;
  for (const auto& [i, fence] : turns) {
    while (expected == 3 || expected == 6) ++expected;
    CHECK(i == expected);
    CHECK(fence > last);
    last = fence;
    ++expected;
  }
}

// Issue 16, item 2: a CPU-bound handler on the single thread of the user's
// io_context. Orders are checked, with margins of whole leases.

namespace {

using Clock = std::chrono::steady_clock;

// Posts a handler that spins on the loop's thread until `until` (set later)
// passes; returns once it spins.
struct Spinner {
  std::atomic<Clock::rep> until{Clock::time_point::max().time_since_epoch().count()};
  Clock::time_point ended;  // read after a handler queued behind it ran
  void start(asio::io_context& io) {
    std::promise<void> spinning;
    asio::post(io, [&] {
      spinning.set_value();
      while (Clock::now().time_since_epoch().count() < until.load()) {
      }
      ended = Clock::now();
    });
    spinning.get_future().wait();
  }
  void stop_at(Clock::time_point t) { until = t.time_since_epoch().count(); }
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

TEST_CASE("AsioMutex: a handler spinning past the stale threshold does not stop the heartbeats", "[asio][session]") {
  SessionWorld w;
  auto held = w.a.async_try_acquire(asio::use_future).get();
  REQUIRE(held);
  Spinner spin;
  spin.start(w.io);
  const auto began = Clock::now();
  spin.stop_at(began + 4s);  // the stale threshold is 3 s
  std::this_thread::sleep_until(began + 3500ms);
  // A rival on the other session: the row would be stale by now had the beats stopped with the loop.
  const auto tried_at = Clock::now();
  auto rival = w.c.try_acquire();
  const bool lost_meanwhile = held.lost();
  std::promise<void> after_spin;
  asio::post(w.io, [&] { after_spin.set_value(); });
  after_spin.get_future().wait();
  INFO("rival tried " << seconds(tried_at - began) << " s after the spin began");
  CHECK_FALSE(rival);
  CHECK(rival.why() == Errc::lock_held);
  CHECK_FALSE(lost_meanwhile);
  CHECK_FALSE(held.lost());
  CHECK(w.row()->instance_id == "a");
  held.async_release(asio::use_future).get();
}

TEST_CASE("AsioMutex: a handler spinning past the lease; the stop token fires at the deadline, off the loop",
          "[asio][session]") {
  SessionWorld w;
  const auto lease = 1500ms;  // quick(): stale 3 s - margin 1.5 s
  auto held = w.a.async_try_acquire(asio::use_future).get();
  REQUIRE(held);
  std::atomic<Clock::rep> stopped_at{0};
  std::atomic<bool> stopped_on_loop{false};
  const auto loop_thread = w.runner.get_id();
  std::stop_callback on_stop(held.stop_token(), [&] {
    stopped_at = Clock::now().time_since_epoch().count();
    stopped_on_loop = std::this_thread::get_id() == loop_thread;
  });
  std::promise<std::pair<error_code, Clock::time_point>> lost;
  held.async_wait_lost([&](error_code ec) { lost.set_value({ec, Clock::now()}); });

  Spinner spin;
  spin.start(w.io);
  // Another session locks the row: every heartbeat from now on waits on it
  // until its timeout and fails, so the last good one went out before now.
  RowLocker blocker(w.table);
  const auto cut_at = Clock::now();  // the deadline is before cut_at + lease
  spin.stop_at(cut_at + 2 * lease);

  auto lost_future = lost.get_future();
  const bool told = lost_future.wait_for(30s) == std::future_status::ready;
  blocker.release();
  REQUIRE(told);
  auto [ec, lost_at] = lost_future.get();
  REQUIRE(stopped_at.load() != 0);
  const Clock::time_point stopped{Clock::duration(stopped_at.load())};
  INFO("stop fired " << seconds(stopped - cut_at) << " s after the row was locked (deadline by "
                     << seconds(lease) << " s); the spin ended at " << seconds(spin.ended - cut_at)
                     << " s; async_wait_lost completed " << seconds(lost_at - spin.ended) << " s after the spin");
  CHECK_FALSE(ec);
  CHECK(stopped < spin.ended);               // the deadline did not wait for the loop
  CHECK(stopped - cut_at < lease + 1000ms);  // at the deadline, give or take a loaded machine
  CHECK_FALSE(stopped_on_loop);
  CHECK(lost_at >= spin.ended);  // the handler runs on the loop, as soon as it is free
  CHECK(lost_at - spin.ended < 1000ms);
  CHECK(held.lost());
}

// Issue 20, friction 1: an AsioMutex program returns from io.run() once its
// work is done. Three AsioMutex on one Session (no work guard), with long
// thresholds: a 600 s stale threshold, a 60 s heartbeat interval. Each
// coroutine acquires (two of them wait for the others' release), heartbeats
// and releases; run() must return long before a heartbeat could be due (its
// bound, 30 s, is half the interval), with the mutexes and the session still
// alive.
TEST_CASE("AsioMutex on a Session: io.run() returns when the last lock is released, whatever the thresholds",
          "[asio][session][exit]") {
  const std::string table = fresh_table("asio_exit");
  auto patient = [&](std::string instance) {
    auto o = options(table, "x", std::move(instance));
    o.heartbeat_interval = 60s;
    o.alert_threshold = 120s;
    o.stale_threshold = 600s;
    o.poll_interval = 50ms;
    return o;
  };
  asio::io_context io;
  auto session = pgmutex::Session::create("");
  std::vector<std::unique_ptr<pgmutex::AsioMutex>> mutexes;
  for (std::string name : {"one", "two", "three"})
    mutexes.push_back(std::make_unique<pgmutex::AsioMutex>(session->backend(), patient(name), pgmutex::SteadyClock{},
                                                           pgmutex::NoMetrics{}, AsioExecutor(io.get_executor())));
  mutexes.front()->create_schema();
  std::atomic<int> released{0};
  for (auto& mutex : mutexes) {
    asio::co_spawn(
        io,
        [&released, m = mutex.get()]() -> asio::awaitable<void> {
          auto g = co_await m->async_acquire(20s, asio::use_awaitable);
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
  mutexes.clear();
  session.reset();
}

// Issue 20, section 2 on a real server: a singleton under a lock name given
// per call shares the mutex's backend (PostgresBackend::share: another
// connection from the same DSN; SessionBackend::share: the same session),
// blocking and async; async_create_schema makes the table.
TEST_CASE("singleton and async_singleton under a lock name given per call, on Postgres and on a Session",
          "[asio][singleton]") {
  const std::string table = fresh_table("asio_singleton");
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  auto session = pgmutex::Session::create("");
  PgAsioMutex own{PostgresBackend(""), quick(table, "own"), {}, {}, AsioExecutor(io.get_executor())};
  pgmutex::AsioMutex shared{session->backend(), quick(table, "shared"), {}, {}, AsioExecutor(io.get_executor())};
  own.async_create_schema(asio::use_future).get();
  auto holder_of = [&](const char* lock) -> std::string {
    auto row = PostgresBackend("").inspect(LockRef{table, lock}).value();
    return row ? row->instance_id : std::string();
  };

  auto blocking = own.singleton("report", [&] { return holder_of("report"); });
  CHECK(blocking() == std::optional<std::string>("own"));
  CHECK(holder_of("report").empty());
  auto on_session = shared.singleton("report", [&] { return holder_of("report"); });
  CHECK(on_session() == std::optional<std::string>("shared"));

  auto async_own = own.async_singleton("report", [&]() -> asio::awaitable<std::string> { co_return holder_of("report"); });
  auto async_shared =
      shared.async_singleton("report", [&]() -> asio::awaitable<std::string> { co_return holder_of("report"); });
  CHECK(async_own(asio::use_future).get() == std::optional<std::string>("own"));
  CHECK(async_shared(asio::use_future).get() == std::optional<std::string>("shared"));
  CHECK(holder_of("report").empty());
  CHECK(holder_of("x").empty());  // the mutexes' own lock was never taken

  work.reset();
  runner.join();
}

TEST_CASE("a waiter whose role may read the queue but not join it is told so at once: blocking and async_acquire",
          "[asio][session][queue][privilege]") {
  // The plain try reads the queue and loses; joining the line is an INSERT
  // into <table>_queue, which this role may not make. That refusal is final:
  // waiting would hide it until the timeout, so both waits return it.
  const std::string table = fresh_table("no_queue_insert");
  PostgresBackend direct("");
  REQUIRE(direct.create_schema(table));
  const std::string role = fresh_table("no_queue_insert_role");
  admin("CREATE ROLE " + role + " LOGIN");
  admin("GRANT SELECT, INSERT, UPDATE, DELETE ON " + table + " TO " + role);
  admin("GRANT SELECT, UPDATE, DELETE ON " + table + "_queue TO " + role);
  admin("GRANT USAGE ON SEQUENCE " + table + "_fence_seq TO " + role);
  pgmutex::AcquireRequest hold{LockRef{table, "x"}, "holder", 60s};
  hold.token = 7;
  auto held = direct.try_acquire(hold);
  REQUIRE((held && held->acquired));

  auto session = pgmutex::Session::create("user=" + role);
  const auto started = std::chrono::steady_clock::now();
  const auto within_timeout = [&] { return std::chrono::steady_clock::now() - started < 20s; };
  SECTION("SessionMutex::acquire") {
    pgmutex::SessionMutex waiter{session->backend(), SessionWorld::slow(table, "blocking")};
    auto got = waiter.acquire(pgmutex::nothrow, 30s);
    REQUIRE_FALSE(got);
    INFO(got.error().message());
    CHECK(got.error() == Errc::permission_denied);
    CHECK_THAT(got.error().message(), Catch::Contains(table + "_queue"));
  }
  SECTION("AsioMutex::async_acquire") {
    asio::io_context io;
    pgmutex::AsioMutex waiter{session->backend(), SessionWorld::slow(table, "async"), {}, {},
                              AsioExecutor(io.get_executor())};
    std::optional<error_code> ended;
    waiter.async_acquire(std::optional<std::chrono::nanoseconds>(30s),
                         [&](error_code ec, pgmutex::AsioMutex::guard_type g) {
                           ended = ec;
                           CHECK_FALSE(g);
                         });
    io.run_for(25s);
    REQUIRE(ended);
    INFO(ended->message());
    CHECK(std::error_code(*ended) == Errc::permission_denied);
  }
  CHECK(within_timeout());  // told at once, not at the 30 s timeout
  auto line = direct.list_queue(table);
  REQUIRE(line);
  CHECK(line->empty());
}

TEST_CASE("AsioElection: async_campaign waits in line, async_proclaim, async_resign hands over; observers' async forms",
          "[asio][session][election]") {
  using pgmutex::LeaderEvent;
  using PgAsioObserver = pgmutex::BasicObserver<PostgresBackend, pgmutex::SteadyClock, pgmutex::NoMetrics, AsioExecutor>;
  SessionWorld w;
  const AsioExecutor loop(w.io.get_executor());
  pgmutex::AsioElection first{w.one->backend(), quick(w.table, "a"), {}, {}, loop};
  pgmutex::AsioElection cancelled_one{w.one->backend(), quick(w.table, "b"), {}, {}, loop};
  pgmutex::AsioElection second{w.two->backend(), quick(w.table, "c"), {}, {}, loop};
  PgAsioObserver watcher{PostgresBackend(""), quick(w.table, "o"), {}, {}, loop};  // LISTENs on its own connection
  pgmutex::AsioObserver on_session{w.two->backend(), quick(w.table, "s"), {}, {}, loop};

  auto present = watcher.async_observe(asio::use_future).get();
  CHECK(present.event == LeaderEvent::current);
  CHECK_FALSE(present.leader);

  // A value over the bound: refused at once, nothing waits.
  std::promise<error_code> refused;
  first.async_campaign(std::string(pgmutex::max_election_value_bytes + 1, 'v'), 1s,
                       [&](error_code ec, auto leadership) {
                         CHECK_FALSE(leadership);
                         refused.set_value(ec);
                       });
  CHECK(refused.get_future().get() == error_code(Errc::invalid_argument));

  auto lead = first.async_campaign("10.0.0.1:80", 10s, asio::use_future).get();
  REQUIRE(lead);
  const pgmutex::Fence first_term = lead.term();
  auto waiting = second.async_campaign("10.0.0.2:80", 30s, asio::use_future);

  // A campaign cancelled while in line gets operation_aborted and leaves no place.
  asio::cancellation_signal signal;
  std::promise<error_code> cancelled;
  cancelled_one.async_campaign("10.0.0.3:80", std::nullopt,
                               asio::bind_cancellation_slot(signal.slot(), [&](error_code ec, auto leadership) {
                                 CHECK_FALSE(leadership);
                                 cancelled.set_value(ec);
                               }));
  std::this_thread::sleep_for(200ms);
  asio::post(w.io, [&] { signal.emit(asio::cancellation_type::terminal); });
  CHECK(cancelled.get_future().get() == asio::error::operation_aborted);

  lead.async_proclaim("10.0.0.1:81", asio::use_future).get();
  CHECK(lead.value() == "10.0.0.1:81");
  auto leads_now = first.async_leader(asio::use_future).get();
  REQUIRE(leads_now);
  CHECK(leads_now->term == first_term);
  CHECK(leads_now->value == "10.0.0.1:81");

  lead.async_resign(asio::use_future).get();
  CHECK_FALSE(lead);
  auto successor = waiting.get();  // the next in line, not the cancelled one
  REQUIRE(successor);
  CHECK(successor.term() > first_term);
  CHECK(successor.value() == "10.0.0.2:80");

  // Every change, in order, from notifications: elected, proclaimed, vacated, elected.
  std::vector<pgmutex::LeaderChange> seen;
  while (seen.size() < 4) seen.push_back(watcher.async_observe(asio::use_future).get());
  CHECK(seen[0].event == LeaderEvent::elected);
  CHECK(seen[0].term == first_term);
  CHECK(seen[1].event == LeaderEvent::proclaimed);
  CHECK(seen[1].leader->value == "10.0.0.1:81");
  CHECK(seen[2].event == LeaderEvent::vacated);
  CHECK(seen[3].event == LeaderEvent::elected);
  CHECK(seen[3].term == successor.term());
  CHECK(seen[3].leader->instance_id == "c");
  for (const auto& c : seen) CHECK_FALSE(c.gap);

  // Nothing more: async_next's timeout is an empty answer; a cancelled wait is operation_aborted.
  CHECK_FALSE(watcher.async_next(100ms, asio::use_future).get());
  asio::cancellation_signal stop_watching;
  std::promise<error_code> stopped;
  watcher.async_observe(asio::bind_cancellation_slot(stop_watching.slot(), [&](error_code ec, const auto&) {
    stopped.set_value(ec);
  }));
  std::this_thread::sleep_for(100ms);
  asio::post(w.io, [&] { stop_watching.emit(asio::cancellation_type::terminal); });
  CHECK(stopped.get_future().get() == asio::error::operation_aborted);

  // An observer on a Session starts from the present.
  auto now = on_session.async_observe(asio::use_future).get();
  CHECK(now.event == LeaderEvent::current);
  CHECK(now.term == successor.term());

  successor.async_resign(asio::use_future).get();
  CHECK_FALSE(w.row());  // nobody in line: the cancelled campaign left no place
  // The last completion runs on the loop, not through use_future's system
  // executor: a completion posted from pgmutex's pool to the system context
  // signals its condition variable after queuing, which ThreadSanitizer saw
  // race with that context's destruction at exit when it was the process's
  // last operation. The loop is woken under its scheduler's lock (AsioExecutor).
  std::promise<std::pair<error_code, pgmutex::LeaderChange>> heard;
  on_session.async_observe([&](error_code ec, pgmutex::LeaderChange c) { heard.set_value({ec, std::move(c)}); });
  auto [ec, vacated] = heard.get_future().get();
  CHECK_FALSE(ec);
  CHECK(vacated.event == LeaderEvent::vacated);
  CHECK_FALSE(vacated.leader);
}
