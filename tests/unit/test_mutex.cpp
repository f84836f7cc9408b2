// BasicMutex on the simulated world: acquire, release, guard, singleton,
// errors in both forms, metrics. Virtual time: nothing here sleeps.
#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/testing/simulation.hpp"
#include "pgmutex/testing/recording_metrics.hpp"

#include <catch2/catch.hpp>

#include <stdexcept>

using namespace pgmutex;
using namespace pgmutex::testing;
using namespace std::chrono_literals;

namespace {

Options opts(std::string instance, std::string lock = "nightly-report-job") {
  return Options{.lock_name = std::move(lock), .instance_id = std::move(instance)};
}

struct World {
  Simulation sim;
  RecordingMetrics record;
  BasicSimMutex<RecordingMetrics> a = sim.instance(opts("a"), record);
  BasicSimMutex<RecordingMetrics> b = sim.instance(opts("b"), record);
  World() { a.create_schema(); }
};

struct ThrowingMetrics {
  void acquired(std::string_view, std::string_view, Fence) { throw std::runtime_error("broken sink"); }
  void released(std::string_view, std::string_view) { throw std::runtime_error("broken sink"); }
  void contended(std::string_view, std::string_view) { throw 42; }
  void alert(std::string_view, std::string_view, double) { throw std::runtime_error("broken sink"); }
  void heartbeat_latency(std::string_view, std::string_view, double) { throw std::runtime_error("broken sink"); }
  void lost(std::string_view, std::string_view, const Error&) { throw std::runtime_error("broken sink"); }
};

}  // namespace

TEST_CASE("one instance acquires, the other sees it held; release lets it in", "[mutex]") {
  World w;
  auto ga = w.a.try_acquire();
  REQUIRE(ga);
  CHECK(ga.fence() == 1);
  CHECK(w.a.held());

  auto gb = w.b.try_acquire();
  CHECK_FALSE(gb);
  CHECK(gb.why() == Errc::lock_held);
  REQUIRE(gb.holder());
  CHECK(gb.holder()->instance_id == "a");
  CHECK(gb.holder()->fence == 1);

  ga.release();
  CHECK_FALSE(ga);
  CHECK_FALSE(w.a.held());
  auto again = w.b.try_acquire();
  REQUIRE(again);
  CHECK(again.fence() == 2);
}

TEST_CASE("the guard releases on scope exit and moves", "[mutex][guard]") {
  World w;
  {
    auto g = w.a.try_acquire();
    REQUIRE(g);
    auto moved = std::move(g);
    CHECK_FALSE(g);  // NOLINT(bugprone-use-after-move): a moved-from guard is empty
    CHECK(moved);
  }
  CHECK_FALSE(w.a.held());
  auto row = w.b.inspect();
  CHECK_FALSE(row);
  CHECK(w.b.try_acquire());
}

TEST_CASE("fences strictly increase across grants, whoever holds", "[mutex][fence]") {
  World w;
  Fence last = 0;
  for (int i = 0; i < 10; ++i) {
    auto& m = (i % 2 == 0) ? w.a : w.b;
    auto g = m.try_acquire();
    REQUIRE(g);
    CHECK(g.fence() > last);
    last = g.fence();
  }
}

TEST_CASE("acquiring twice through one object is an error, not a deadlock", "[mutex][errors]") {
  World w;
  auto g = w.a.try_acquire();
  REQUIRE(g);
  auto twice = w.a.try_acquire(nothrow);
  REQUIRE_FALSE(twice);
  CHECK(twice.error() == Errc::already_acquired);
  CHECK_THAT(twice.error().detail, Catch::Contains("lock 'nightly-report-job'") && Catch::Contains("fence 1"));
  CHECK_THROWS_AS(w.a.try_acquire(), LockHeldError);
  auto blocking = w.a.acquire(nothrow, 10s);
  REQUIRE_FALSE(blocking);
  CHECK(blocking.error() == Errc::already_acquired);
  CHECK(g.fence() == 1);  // the grant is untouched
  CHECK(w.a.held());
}

TEST_CASE("release or heartbeat of a lock not held: LockNotHeldError", "[mutex][errors]") {
  World w;
  auto r = w.a.release(nothrow);
  REQUIRE_FALSE(r);
  CHECK(r.error() == Errc::lock_not_held);
  CHECK_THROWS_AS(w.a.release(), LockNotHeldError);
  CHECK_THROWS_AS(w.a.heartbeat(), LockNotHeldError);
  auto g = w.a.try_acquire();
  g.release();
  CHECK_THROWS_AS(g.release(), LockNotHeldError);
  CHECK_THROWS_AS(g.heartbeat(), LockNotHeldError);
}

TEST_CASE("invalid options throw from the constructor and fail create()", "[mutex][errors]") {
  Simulation sim;
  CHECK_THROWS_AS(sim.instance(Options{.lock_name = std::string(65, 'x'), .instance_id = "a"}), InvalidArgumentError);
  auto made = SimMutex::create(sim.connection(), Options{.lock_name = "", .instance_id = "a"}, sim.clock(), {},
                               sim.executor());
  REQUIRE_FALSE(made);
  CHECK(made.error() == Errc::invalid_argument);
  CHECK_THAT(made.error().detail, Catch::Contains("lock_name must not be empty"));
}

TEST_CASE("a backend error carries the lock name and the cause", "[mutex][errors]") {
  Simulation sim;
  auto m = sim.instance(opts("a"));  // no create_schema: the table does not exist
  auto r = m.try_acquire(nothrow);
  REQUIRE_FALSE(r);
  CHECK(r.error() == Errc::schema_missing);
  CHECK_THAT(r.error().message(), Catch::Contains("lock 'nightly-report-job'") && Catch::Contains("create_schema"));
  CHECK_THROWS_AS(m.try_acquire(), BackendError);
}

TEST_CASE("blocking acquire waits for a release, in virtual time", "[mutex][wait]") {
  World w;
  auto ga = w.a.try_acquire();
  // a releases 20 s from now.
  w.sim.executor().schedule_after(20s, [&] { ga.release(); });
  const auto start = w.sim.now();
  auto gb = w.b.acquire(60s);
  REQUIRE(gb);
  const auto waited = w.sim.now() - start;
  CHECK(waited >= 20s);
  CHECK(waited <= 20s + w.b.options().poll_interval);
  CHECK(gb.fence() == 2);
}

TEST_CASE("blocking acquire gives up at its timeout with an empty guard", "[mutex][wait]") {
  World w;
  auto ga = w.a.try_acquire();
  const auto start = w.sim.now();
  auto gb = w.b.acquire(5s);
  CHECK_FALSE(gb);
  CHECK(gb.why() == Errc::timeout);
  REQUIRE(gb.holder());
  CHECK(gb.holder()->instance_id == "a");
  CHECK(w.sim.now() - start == 5s);
}

TEST_CASE("blocking acquire is cancelled through its stop_token", "[mutex][wait]") {
  World w;
  auto ga = w.a.try_acquire();
  std::stop_source stop;
  w.sim.executor().schedule_after(3s, [&] { stop.request_stop(); });
  auto gb = w.b.acquire(std::nullopt, stop.get_token());
  CHECK_FALSE(gb);
  CHECK(gb.why() == Errc::cancelled);
  CHECK(w.sim.now().time_since_epoch() <= 3s + w.b.options().poll_interval);
}

TEST_CASE("the automatic heartbeat keeps a long hold fresh", "[mutex][heartbeat]") {
  World w;
  auto g = w.a.try_acquire();
  w.sim.advance(2h);
  auto row = w.b.inspect();
  REQUIRE(row);
  CHECK(row->instance_id == "a");
  CHECK(row->seconds_since_heartbeat < 10.0);
  CHECK_FALSE(g.lost());
  // One heartbeat per interval: 2 h / 10 s.
  CHECK(w.record.count("heartbeat_latency") == 720);
  // Nobody can take it.
  CHECK_FALSE(w.b.try_acquire());
}

TEST_CASE("a manual heartbeat refreshes the row", "[mutex][heartbeat]") {
  World w;
  auto g = w.a.try_acquire();
  w.sim.advance(5s);
  g.heartbeat();
  w.a.heartbeat();
  auto row = w.b.inspect();
  REQUIRE(row);
  CHECK(row->seconds_since_heartbeat == Approx(0.0));
}

TEST_CASE("metrics hooks are called with the right arguments", "[mutex][metrics]") {
  World w;
  w.sim.server().set_latency(250ms);
  auto ga = w.a.try_acquire();
  auto gb = w.b.try_acquire();
  w.sim.advance(10s);
  ga.release();

  const auto acquired = w.record.events("acquired");
  REQUIRE(acquired.size() == 1);
  CHECK(acquired[0].lock_name == "nightly-report-job");
  CHECK(acquired[0].who == "a");
  CHECK(acquired[0].fence == 1);
  const auto contended = w.record.events("contended");
  REQUIRE(contended.size() == 1);
  CHECK(contended[0].who == "b");
  const auto latency = w.record.events("heartbeat_latency");
  REQUIRE(latency.size() == 1);
  CHECK(latency[0].seconds == Approx(0.25));
  const auto released = w.record.events("released");
  REQUIRE(released.size() == 1);
  CHECK(released[0].who == "a");
}

TEST_CASE("a metrics hook that throws never breaks the lock", "[mutex][metrics]") {
  Simulation sim;
  auto a = sim.instance(opts("a"), ThrowingMetrics{});
  auto b = sim.instance(opts("b"), ThrowingMetrics{});
  a.create_schema();
  auto ga = a.try_acquire();
  REQUIRE(ga);
  CHECK_FALSE(b.try_acquire());
  sim.advance(60s);  // heartbeats (latency hook throws) and an alert (hook throws)
  CHECK_FALSE(b.try_acquire());
  CHECK_FALSE(ga.lost());
  CHECK_NOTHROW(ga.release());
  CHECK(b.try_acquire());
}

TEST_CASE("several sinks combine into one", "[mutex][metrics]") {
  Simulation sim;
  RecordingMetrics first, second;
  auto a = sim.instance(opts("a"), MetricsFanout(first, ThrowingMetrics{}, second));
  a.create_schema();
  auto g = a.try_acquire();
  g.release();
  CHECK(first.count("acquired") == 1);
  CHECK(second.count("acquired") == 1);  // the throwing sink between them did not stop it
  CHECK(second.count("released") == 1);
}

TEST_CASE("singleton runs the function only when the lock is acquired", "[mutex][singleton]") {
  World w;
  int runs = 0;
  auto job = w.b.singleton([&] { return ++runs; });

  auto first = job();
  REQUIRE(first);
  CHECK(*first == 1);
  CHECK_FALSE(w.b.held());  // released after the run

  auto ga = w.a.try_acquire();
  CHECK_FALSE(job());  // taken: not run
  CHECK(runs == 1);
  ga.release();

  // void functions report whether they ran; the guard or stop_token may be taken.
  auto with_guard = w.b.singleton([&](BasicSimMutex<RecordingMetrics>::guard_type& g) { CHECK(g.fence() > 0); });
  CHECK(with_guard());
  auto with_token = w.b.singleton([&](std::stop_token stop, int x) { return stop.stop_requested() ? -1 : x * 2; });
  CHECK(with_token(21) == 42);
}

TEST_CASE("singleton releases when the function throws, and can wait", "[mutex][singleton]") {
  World w;
  auto boom = w.a.singleton([] { throw std::runtime_error("job failed"); });
  CHECK_THROWS_WITH(boom(), "job failed");
  CHECK_FALSE(w.a.held());

  auto ga = w.a.try_acquire();
  w.sim.executor().schedule_after(3s, [&] { ga.release(); });
  auto waiting = w.b.singleton([] { return 7; }, WaitPolicy{.blocking = true, .timeout = 10s});
  CHECK(waiting() == 7);

  auto gb = w.b.try_acquire();
  auto impatient = w.a.singleton([] { return 7; }, WaitPolicy{.blocking = true, .timeout = 2s});
  auto r = impatient.call(nothrow);
  REQUIRE(r);
  CHECK_FALSE(*r);
}

// Issue 20, section 2: the seed's singleton(lock_name): a lock name given per
// call, on the mutex's backend and options (instance id, table, thresholds).
TEST_CASE("singleton under a lock name given per call shares the backend and options", "[mutex][singleton]") {
  World w;
  int runs = 0;
  auto report = w.b.singleton(
      "report-job", [&](BasicSimMutex<RecordingMetrics>::guard_type& g) {
        ++runs;
        auto row = w.sim.instance(opts("watcher", "report-job")).inspect();
        REQUIRE(row);
        CHECK(row->instance_id == "b");  // the mutex's instance id, in its table
        CHECK(g.fence() == row->fence);
      });
  CHECK(report());
  CHECK(runs == 1);
  CHECK_FALSE(w.b.held());  // the mutex's own lock was never taken
  CHECK_FALSE(w.a.inspect());

  // Held by another instance under that name: not run; the row names the
  // mutex's instance id and lives in the mutex's table.
  auto other = w.sim.instance(opts("c", "report-job"), w.record);
  auto held = other.try_acquire();
  REQUIRE(held);
  CHECK_FALSE(report());
  CHECK(runs == 1);
  auto waiting = w.b.singleton("report-job", [&] { return ++runs; }, WaitPolicy{.blocking = true, .timeout = 10s});
  w.sim.executor().schedule_after(3s, [&] { held.release(); });
  CHECK(waiting() == 2);
  auto held_by_b = w.b.singleton("report-job", [&] { return w.a.singleton("report-job", [] {})(); });
  CHECK(held_by_b() == std::optional<bool>(false));  // a's wrapper sees b's instance hold it

  // The mutex's own lock and the per-call one are independent.
  auto own = w.b.try_acquire();
  REQUIRE(own);
  CHECK(report());
  own.release();

  // The wrapper keeps working after its mutex is gone (moved out and destroyed).
  auto job = w.a.singleton("moved-job", [] { return 5; });
  { auto gone = std::move(w.a); }
  CHECK(job() == 5);
}

TEST_CASE("singleton under an invalid lock name is refused, naming the name and the rule", "[mutex][singleton]") {
  World w;
  auto empty = w.b.singleton(nothrow, "", [] {});
  REQUIRE_FALSE(empty);
  CHECK(empty.error() == Errc::invalid_argument);
  CHECK(empty.error().detail == "singleton lock name \"\" refused: lock_name must not be empty");

  const std::string long_name(70, 'x');
  auto too_long = w.b.singleton(nothrow, long_name, [] {});
  REQUIRE_FALSE(too_long);
  CHECK(too_long.error().detail == "singleton lock name \"" + long_name +
                                       "\" refused: lock_name must be at most 64 characters, got 70");
  CHECK_THROWS_AS(w.b.singleton("bad\xff", [] {}), InvalidArgumentError);
  CHECK_THROWS_WITH(w.b.singleton(std::string("nul\0byte", 8), [] {}),
                    Catch::StartsWith("singleton lock name \"nul?byte\" refused: lock_name must not contain a NUL byte"));
  auto fine = w.b.singleton(nothrow, "fine", [] { return 1; });
  REQUIRE(fine);
  CHECK((*fine)() == 1);
}

TEST_CASE("ManualExecutor runs due tasks in time order, ties in scheduling order", "[executor]") {
  ManualClock clock;
  ManualExecutor ex(clock);
  std::vector<int> order;
  ex.schedule_after(2s, [&] { order.push_back(2); });
  ex.schedule_after(1s, [&] { order.push_back(1); });
  const auto cancelled = ex.schedule_after(1s, [&] { order.push_back(99); });
  ex.schedule_after(1s, [&] { order.push_back(11); });
  ex.cancel(cancelled);
  ex.advance(1500ms);
  CHECK(order == std::vector<int>{1, 11});
  CHECK(clock.now().time_since_epoch() == 1500ms);
  ex.advance(1s);
  CHECK(order == std::vector<int>{1, 11, 2});
  CHECK(ex.pending() == 0);
}

TEST_CASE("ThreadExecutor runs tasks on its thread, cancels, and waits interruptibly", "[executor]") {
  ThreadExecutor ex;
  std::atomic<int> ran{0};
  std::stop_source done;
  ex.schedule_after(1ms, [&] {
    ran = 1;
    done.request_stop();
  });
  const auto never = ex.schedule_after(1h, [&] { ran = 2; });
  CHECK(ex.wait_for(10s, done.get_token()));  // woken by the task, not the timeout
  ex.cancel(never);
  CHECK(ran == 1);
  CHECK_FALSE(ex.wait_for(1ms, std::stop_token{}));
}

TEST_CASE("real time: SteadyClock, ThreadExecutor and MemoryBackend together", "[mutex][threads]") {
  auto server = MemoryServer::create();
  using RealMutex = BasicMutex<MemoryBackend, SteadyClock, RecordingMetrics>;
  RecordingMetrics record;
  const Options fast{.lock_name = "job", .instance_id = "a", .heartbeat_interval = 5ms, .alert_threshold = 50ms,
                     .stale_threshold = 100ms, .poll_interval = 5ms, .safety_margin = 20ms};
  RealMutex a(MemoryBackend(server, "a"), fast, {}, record);
  a.create_schema();
  auto g = a.try_acquire();
  REQUIRE(g);
  std::stop_source saw_loss;
  std::stop_callback on_loss(g.stop_token(), [&] { saw_loss.request_stop(); });
  server->partition("a");
  // The watchdog fires 80 ms after the last good heartbeat; wait up to 10 s for it.
  ThreadExecutor{}.wait_for(10s, saw_loss.get_token());
  CHECK(g.lost());
  // The token stops first, then the `lost` hook runs (mutex_state.hpp
  // announce_lost): this thread may wake in between. Wait for it, up to 10 s.
  for (int i = 0; i < 1000 && record.count("lost") == 0; ++i) ThreadExecutor{}.wait_for(10ms, {});
  CHECK(record.count("lost") == 1);
  CHECK(record.count("heartbeat_failed") >= 1);
}

namespace {
// Calls every hook that takes no Error on a type that has none of them: it
// must be constant-evaluable, i.e. there is nothing left to run.
constexpr bool absent_hooks_are_empty() {
  NoMetrics none;
  call_acquired(none, "lock", "me", 1);
  call_released(none, "lock", "me");
  call_contended(none, "lock", "me");
  call_stale_reclaimed(none, "lock", "me", "them");
  call_alert(none, "lock", "them", 31.0);
  call_heartbeat_latency(none, "lock", "me", 0.001);
  return true;
}
}  // namespace

TEST_CASE("an absent hook is no code at all", "[metrics]") {
  STATIC_REQUIRE(absent_hooks_are_empty());
}
