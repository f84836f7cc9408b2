// The seed's "Failure modes, explicitly", each simulated in virtual time, plus
// the faults DESIGN.md adds: unknown outcomes, dropped connections, takeovers.
// A 10-minute stale threshold passes in microseconds: nothing here sleeps.
#include "pgmutex/testing/simulation.hpp"
#include "pgmutex/testing/recording_metrics.hpp"

#include <catch2/catch.hpp>

using namespace pgmutex;
using namespace pgmutex::testing;
using namespace std::chrono_literals;

namespace {

using Instance = BasicSimMutex<RecordingMetrics>;

// Defaults as in the seed: heartbeat 10 s, alert 30 s, stale 600 s; lease 540 s.
struct World {
  Simulation sim;
  RecordingMetrics record_a, record_b;
  Instance a = sim.instance(Options{.lock_name = "job", .instance_id = "a"}, record_a);
  Instance b = sim.instance(Options{.lock_name = "job", .instance_id = "b"}, record_b);
  World() { a.create_schema(); }

  // b tries once every `step` until `until` (virtual time since start); returns the winning guard if any.
  Instance::guard_type b_tries_until(std::chrono::seconds until, std::chrono::seconds step = 10s) {
    while (sim.now().time_since_epoch() < until) {
      sim.advance(step);
      if (auto g = b.try_acquire()) return g;
    }
    return {};
  }
};

double seconds_since_epoch(ManualClock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }

}  // namespace

TEST_CASE("holder crashes: alert at alert_threshold, reclaim at stale_threshold", "[failure][crash]") {
  World w;
  auto ga = w.a.try_acquire();
  REQUIRE(ga);
  w.sim.server().partition("a");  // the holder is gone: no request of its reaches the server

  w.sim.advance(29s);
  CHECK_FALSE(w.b.try_acquire());
  CHECK(w.record_b.count("alert") == 0);  // 29 s: slow is still fine

  w.sim.advance(2s);
  CHECK_FALSE(w.b.try_acquire());
  auto alerts = w.record_b.events("alert");
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0].who == "a");
  CHECK(alerts[0].seconds == Approx(31.0));

  // Still taken until the stale threshold; the alert is raised once per holder and fence.
  w.sim.advance(568s);  // t = 599 s
  CHECK_FALSE(w.b.try_acquire());
  CHECK(w.record_b.count("alert") == 1);

  w.sim.advance(2s);  // t = 601 s
  auto gb = w.b.try_acquire();
  REQUIRE(gb);
  CHECK(gb.fence() > ga.fence());
  auto reclaimed = w.record_b.events("stale_reclaimed");
  REQUIRE(reclaimed.size() == 1);
  CHECK(reclaimed[0].who == "b");
  CHECK(reclaimed[0].other == "a");
  // The crashed holder's own watchdog had declared the lease lost at 540 s, before the reclaim.
  CHECK(ga.lost());
}

TEST_CASE("slow holder: the alert fires, but the lock stays with it", "[failure][slow]") {
  World w;
  auto ga = w.a.try_acquire();
  w.sim.advance(5s);
  // A 45-second stall (GC pause, long query): heartbeats do not get through.
  w.sim.server().partition("a");
  w.sim.advance(40s);
  CHECK_FALSE(w.b.try_acquire());
  CHECK(w.record_b.count("alert") == 1);
  w.sim.server().heal("a");
  w.sim.advance(20s);  // heartbeats resume
  CHECK_FALSE(ga.lost());
  auto row = w.b.inspect();
  REQUIRE(row);
  CHECK(row->instance_id == "a");
  CHECK(row->seconds_since_heartbeat < 10.0);
  CHECK(w.record_a.count("heartbeat_failed") >= 1);  // failures were counted...
  CHECK(w.record_a.count("lost") == 0);              // ...and not taken as loss
  CHECK_FALSE(w.b_tries_until(20min));
}

TEST_CASE("partition shorter than stale_threshold: the holder keeps the lock", "[failure][partition]") {
  World w;
  auto ga = w.a.try_acquire();
  w.sim.server().partition("a");
  CHECK_FALSE(w.b_tries_until(300s));  // 5 minutes of partition
  w.sim.server().heal("a");
  w.sim.advance(15s);
  CHECK_FALSE(ga.lost());
  CHECK_NOTHROW(ga.heartbeat());
  CHECK(ga.fence() == 1);
  CHECK_FALSE(w.b_tries_until(30min));
  CHECK(w.record_b.count("stale_reclaimed") == 0);
}

TEST_CASE("partition longer than stale_threshold: the watchdog fires before anyone can reclaim",
          "[failure][partition]") {
  World w;
  auto ga = w.a.try_acquire();
  std::optional<ManualClock::time_point> stopped_at;
  std::stop_callback on_stop(ga.stop_token(), [&] { stopped_at = w.sim.now(); });

  w.sim.advance(25s);  // good heartbeats sent at 10 s and 20 s
  w.sim.server().partition("a");

  w.sim.advance(534s);  // t = 559 s: 539 s after the last good send
  CHECK_FALSE(ga.lost());
  w.sim.advance(2s);  // t = 561 s
  CHECK(ga.lost());
  REQUIRE(stopped_at);
  CHECK(seconds_since_epoch(*stopped_at) == Approx(560.0));  // last good send (20 s) + lease (540 s)
  const auto lost = w.record_a.events("lost");
  REQUIRE(lost.size() == 1);
  CHECK_THAT(lost[0].other, Catch::Contains("no successful heartbeat"));

  // Nobody could take it before the stale threshold (620 s); b gets it right after.
  auto gb = w.b_tries_until(640s);
  REQUIRE(gb);
  CHECK(seconds_since_epoch(w.sim.now()) > 620.0);
  CHECK(gb.fence() > ga.fence());

  // The partition heals: the old holder's late heartbeat reports LockNotHeld.
  w.sim.server().heal("a");
  CHECK_THROWS_AS(ga.heartbeat(), LockNotHeldError);
  CHECK_THROWS_AS(w.a.heartbeat(), LockNotHeldError);
  auto release = ga.release(nothrow);
  REQUIRE_FALSE(release);
  CHECK(release.error() == Errc::lock_not_held);
  CHECK_THAT(release.error().detail, Catch::Contains("was lost before release"));
  // b's grant was never touched.
  CHECK_FALSE(gb.lost());
  w.sim.advance(1min);
  CHECK_FALSE(gb.lost());
}

TEST_CASE("client clock skew changes nothing: staleness is the server's", "[failure][skew]") {
  World w;
  auto ga = w.a.try_acquire();
  w.sim.advance(5s);
  for (auto skew : {-3h, 3h, 72h}) {
    // An observer whose own clock is hours off.
    ManualClock skewed;
    skewed.advance(skew > 0h ? skew : 100h + skew);
    ManualExecutor skewed_executor(skewed);
    RecordingMetrics observer;
    BasicSimMutex<RecordingMetrics> c(MemoryBackend(w.sim.server().shared_from_this(), "c"),
                                      Options{.lock_name = "job", .instance_id = "c"}, skewed, observer,
                                      skewed_executor);
    auto gc = c.try_acquire();
    CHECK_FALSE(gc);
    REQUIRE(gc.holder());
    CHECK(gc.holder()->seconds_since_heartbeat == Approx(5.0));  // server time, not c's
    CHECK(observer.count("alert") == 0);
  }
  CHECK(ga.fence() == 1);
  CHECK_FALSE(ga.lost());
}

TEST_CASE("a jump of the server clock past the stale threshold lets others reclaim, and fences still protect",
          "[failure][skew]") {
  World w;
  auto ga = w.a.try_acquire();
  w.sim.server().set_server_offset(1h);  // the server's clock jumps: every row looks stale
  auto gb = w.b.try_acquire();
  REQUIRE(gb);
  CHECK(gb.fence() > ga.fence());
  w.sim.advance(10s);  // a's next heartbeat finds another fence
  CHECK(ga.lost());
  CHECK_THAT(w.record_a.events("lost").at(0).other, Catch::Contains("granted to another holder"));
}

TEST_CASE("instance_id reused by two live objects: fences keep them from touching each other's grant",
          "[failure][instance-id]") {
  Simulation sim;
  auto first = sim.instance(Options{.lock_name = "job", .instance_id = "dup"});
  auto second = sim.instance(Options{.lock_name = "job", .instance_id = "dup"});
  first.create_schema();
  auto g = first.try_acquire();
  REQUIRE(g);
  auto other = second.try_acquire();
  CHECK_FALSE(other);
  CHECK(other.holder()->instance_id == "dup");  // it sees "itself" holding, and does not adopt it
  CHECK_THROWS_AS(second.release(), LockNotHeldError);
  CHECK_THROWS_AS(second.heartbeat(), LockNotHeldError);
  sim.advance(1h);
  CHECK_FALSE(g.lost());
  CHECK(g.fence() == 1);
}

TEST_CASE("an acquire whose reply is lost is resolved by reading the row back", "[failure][unknown]") {
  World w;
  SECTION("the read-back finds our row: acquired") {
    w.sim.server().plan({MemoryServer::Fault::lose_reply});
    auto ga = w.a.try_acquire();
    REQUIRE(ga);
    CHECK(ga.fence() == 1);
    CHECK_FALSE(w.b.try_acquire());
  }
  SECTION("the read-back fails too: outcome_unknown, and the next try adopts our row") {
    w.sim.server().plan({MemoryServer::Fault::lose_reply, MemoryServer::Fault::fail});
    auto first = w.a.try_acquire(nothrow);
    REQUIRE_FALSE(first);
    CHECK(first.error() == Errc::outcome_unknown);
    CHECK_FALSE(w.a.held());
    auto second = w.a.try_acquire();
    REQUIRE(second);
    CHECK(second.fence() == 1);  // the row the first try created
  }
  SECTION("a losing try whose reply is lost reads back the holder") {
    auto gb = w.b.try_acquire();
    w.sim.server().plan({MemoryServer::Fault::lose_reply});
    auto ga = w.a.try_acquire();
    CHECK_FALSE(ga);
    CHECK(ga.holder()->instance_id == "b");
  }
  SECTION("blocking acquire rides through transient failures") {
    w.sim.server().plan({MemoryServer::Fault::fail, MemoryServer::Fault::fail, MemoryServer::Fault::lose_reply,
                         MemoryServer::Fault::fail});
    auto ga = w.a.acquire(10s);
    REQUIRE(ga);
    CHECK(ga.fence() == 1);
  }
}

TEST_CASE("transient heartbeat errors are retried and counted, never loss by themselves", "[failure][heartbeat]") {
  World w;
  auto ga = w.a.try_acquire();
  w.sim.server().fail_next(5);
  w.sim.advance(20s);
  CHECK(w.record_a.count("heartbeat_failed") == 5);
  CHECK_FALSE(ga.lost());
  auto row = w.b.inspect();
  REQUIRE(row);
  CHECK(row->seconds_since_heartbeat < 10.0);  // retried quickly after each failure

  w.sim.server().drop_connection("a");
  w.sim.advance(10s);
  CHECK(w.record_a.count("heartbeat_failed") == 6);
  w.sim.advance(1s);
  CHECK_FALSE(ga.lost());

  w.sim.server().plan({MemoryServer::Fault::lose_reply});  // a heartbeat applied, reply lost
  w.sim.advance(10s);
  CHECK_FALSE(ga.lost());
  CHECK(w.record_a.count("heartbeat_failed") == 7);
}

TEST_CASE("a release whose reply is lost is retried, and counts as done", "[failure][unknown]") {
  World w;
  auto ga = w.a.try_acquire();
  w.sim.server().plan({MemoryServer::Fault::lose_reply});
  CHECK_NOTHROW(ga.release());
  CHECK_FALSE(w.b.inspect());
  CHECK(w.record_a.count("released") == 1);
  CHECK(w.b.try_acquire());
}

TEST_CASE("a heartbeat that finds the row gone declares the lease lost", "[failure][heartbeat]") {
  World w;
  auto ga = w.a.try_acquire();
  bool stopped = false;
  std::stop_callback on_stop(ga.stop_token(), [&] { stopped = true; });
  auto admin = w.sim.connection("admin");
  auto removed = admin.force_release(LockRef{"mutex_lock", "job"});
  REQUIRE(removed);
  REQUIRE(*removed);
  CHECK((*removed)->instance_id == "a");
  w.sim.advance(10s);
  CHECK(ga.lost());
  CHECK(stopped);
  CHECK_FALSE(w.a.held());
  CHECK_THAT(w.record_a.events("lost").at(0).other, Catch::Contains("row gone"));
  // A new acquire through the same object is allowed once the old grant is lost.
  auto again = w.a.try_acquire();
  REQUIRE(again);
  CHECK(again.fence() > ga.fence());
  CHECK_FALSE(again.lost());
  CHECK(ga.lost());  // the old guard still reports its own grant
}

TEST_CASE("a stop_token taken after the loss is already stopped", "[failure][guard]") {
  World w;
  auto ga = w.a.try_acquire();
  w.sim.server().partition("a");
  w.sim.advance(20min);
  CHECK(ga.lost());
  CHECK(ga.stop_token().stop_requested());
}

TEST_CASE("same inputs, same trace", "[failure][determinism]") {
  auto run = [] {
    World w;
    std::vector<std::string> trace;
    auto ga = w.a.try_acquire();
    w.sim.server().partition("a");
    for (int i = 0; i < 70; ++i) {
      w.sim.advance(10s);
      auto gb = w.b.try_acquire();
      trace.push_back(std::to_string(w.sim.now().time_since_epoch().count()) + (gb ? " won " : " lost ") +
                      std::to_string(gb ? gb.fence() : gb.holder()->fence));
    }
    for (const auto& e : w.record_a.events()) trace.push_back(e.hook + e.other);
    for (const auto& e : w.record_b.events()) trace.push_back(e.hook + e.who + std::to_string(e.seconds));
    return trace;
  };
  CHECK(run() == run());
}

TEST_CASE("an acquire that failed with an unknown outcome, and left nothing, is tried again", "[failure][unknown]") {
  World w;
  w.sim.server().fail_next(1, Errc::outcome_unknown);  // not applied, but reported as unknown
  auto ga = w.a.try_acquire();
  REQUIRE(ga);  // the read-back found no row, so one more try settled it
  CHECK(ga.fence() == 1);
}

namespace {
// A backend that can be told of releases, but whose waits always fail. It
// wraps the in-memory one for the required operations alone: it has no
// queue, so a blocking acquire waits for releases through it.
struct BrokenWaitBackend {
  BrokenWaitBackend(std::shared_ptr<MemoryServer> server, std::string connection)
      : memory(std::move(server), std::move(connection)) {}
  Result<void> create_schema(std::string_view table) noexcept { return memory.create_schema(table); }
  Result<AcquireResult> try_acquire(const AcquireRequest& request) noexcept { return memory.try_acquire(request); }
  Result<void> heartbeat(const HolderKey& key) noexcept { return memory.heartbeat(key); }
  Result<void> release(const HolderKey& key) noexcept { return memory.release(key); }
  Result<std::optional<LockRow>> inspect(LockRef lock) noexcept { return memory.inspect(lock); }
  Result<std::vector<LockRow>> list(std::string_view table) noexcept { return memory.list(table); }
  Result<std::optional<LockRow>> force_release(LockRef lock) noexcept { return memory.force_release(lock); }
  Result<bool> wait_for_release(LockRef, std::chrono::nanoseconds) noexcept {
    ++*waits;
    return fail(Errc::backend_unavailable, "LISTEN failed");
  }
  MemoryBackend memory;
  std::shared_ptr<int> waits = std::make_shared<int>(0);
};
static_assert(Backend<BrokenWaitBackend>);
static_assert(BackendWaitsForRelease<BrokenWaitBackend>);
static_assert(!BackendQueuesWaiters<BrokenWaitBackend>);
}  // namespace

TEST_CASE("a blocking acquire whose wait for release fails sleeps out the poll instead of spinning",
          "[failure][wait]") {
  World w;
  auto ga = w.a.try_acquire();
  BrokenWaitBackend backend(w.sim.server().shared_from_this(), "c");
  auto waits = backend.waits;
  BasicMutex<BrokenWaitBackend, ManualClock, NoMetrics, ManualExecutor> c(
      std::move(backend), Options{.lock_name = "job", .instance_id = "c"}, w.sim.clock(), {}, w.sim.executor());
  const auto start = w.sim.now();
  auto gc = c.acquire(5s);
  CHECK_FALSE(gc);
  CHECK(gc.why() == Errc::timeout);
  CHECK(w.sim.now() - start == 5s);
  CHECK(*waits == 10);  // one failed wait per 500 ms poll, each followed by a sleep
}
