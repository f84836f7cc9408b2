// The holder's guarantee (DESIGN.md, "The execution model"): the holder knows
// it lost the lock before anyone can take it, whatever its statements do.
//   1. the lease deadline is a timer that does no I/O;
//   2. no user code runs under an internal lock;
//   3. accessors never wait for the network; every statement has a bound.
// Most cases run in virtual time; two need real threads (a statement that
// really blocks one thread while others go on), with short real leases.
#include "pgmutex/testing/simulation.hpp"
#include "pgmutex/testing/recording_metrics.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <vector>
#include <atomic>
#include <functional>
#include <thread>

using namespace pgmutex;
using namespace pgmutex::testing;
using namespace std::chrono_literals;

namespace {

using Instance = BasicSimMutex<RecordingMetrics>;
using RealMutex = BasicMutex<MemoryBackend>;  // steady clock, ThreadExecutor: real threads

double at_seconds(ManualClock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }

// Lease 40 s; one heartbeat attempt may take 20 s.
Options slow_statements(std::string instance) {
  return Options{.lock_name = "job", .instance_id = std::move(instance), .heartbeat_interval = 10s,
                 .alert_threshold = 30s, .stale_threshold = 60s, .safety_margin = 20s, .heartbeat_timeout = 20s};
}

// Real time, kept short: lease 1 s, heartbeats every 100 ms, an attempt may take 1 s.
Options real_options(std::string lock, std::string instance, std::string table = "mutex_lock") {
  return Options{.lock_name = std::move(lock), .instance_id = std::move(instance), .table = std::move(table),
                 .heartbeat_interval = 100ms, .alert_threshold = 500ms, .stale_threshold = 2s,
                 .safety_margin = 1s, .heartbeat_timeout = 1s};
}

// Polls `done` every few milliseconds for up to `limit` of real time: a test
// that would otherwise hang on a deadlock fails instead.
bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit = 10000ms) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return done();
}

}  // namespace

TEST_CASE("a heartbeat that hangs does not delay the lease deadline", "[guarantee]") {
  Simulation sim;
  RecordingMetrics record;
  Instance a = sim.instance(slow_statements("a"), record);
  a.create_schema();
  auto guard = a.try_acquire();  // t = 0: the lease ends at 40 s
  REQUIRE(guard);

  double stopped_at = -1;
  int hanging_when_stopped = -1;
  bool lost_seen_in_callback = false;
  std::stop_callback on_stop(guard.stop_token(), [&] {
    stopped_at = at_seconds(sim.now());
    hanging_when_stopped = sim.server().hanging();
    lost_seen_in_callback = guard.lost();
  });
  sim.server().hang("a");  // every statement of a's connection now waits until unhang()
  sim.advance(35s);        // a beat at 10 s hangs, times out at 30 s, is retried and hangs again

  CHECK(stopped_at == Approx(40.0));    // at the deadline to the tick...
  CHECK(hanging_when_stopped == 1);     // ...while a heartbeat still hung
  CHECK(lost_seen_in_callback);
  CHECK(guard.lost());
  CHECK_FALSE(guard);  // a lost guard no longer converts to true
  CHECK_FALSE(a.held());
  CHECK(record.count("lost") == 1);
  CHECK(record.count("heartbeat_failed") >= 1);

  sim.server().unhang("a");
  sim.advance(30s);
  CHECK(guard.lost());  // a late answer never undoes a loss
  CHECK(record.count("lost") == 1);
}

TEST_CASE("one hung statement stops no other lock, and its holder knows before a rival can take it",
          "[guarantee][threads]") {
  const std::string other_table = GENERATE(std::string("mutex_lock"), std::string("other_locks"));
  auto server = MemoryServer::create();
  RealMutex x(MemoryBackend(server, "x"), real_options("x", "holder"));
  RealMutex y(MemoryBackend(server, "y"), real_options("y", "holder", other_table));
  RealMutex rival(MemoryBackend(server, "rival"), real_options("x", "rival"));
  x.create_schema();
  y.create_schema();
  auto gx = x.try_acquire();
  auto gy = y.try_acquire();
  REQUIRE(gx);
  REQUIRE(gy);

  server->hang("x");  // x's heartbeats now wait (like a row lock held by another session)
  bool saw_hang = false;
  bool holder_knew_first = false;
  RealMutex::guard_type taken;
  const bool rival_won = eventually([&] {
    // The accessors answer while x's statement hangs (a deadlock would stop this loop).
    (void)gx.lost();
    (void)gx.fence();
    (void)gx.stop_token();
    (void)x.held();
    saw_hang = saw_hang || server->hanging() > 0;
    auto attempt = rival.try_acquire(nothrow);
    if (!attempt || !*attempt) return false;
    holder_knew_first = gx.lost();  // read right after the rival won: it must already be true
    taken = std::move(*attempt);
    return true;
  });
  REQUIRE(rival_won);
  CHECK(saw_hang);
  CHECK(holder_knew_first);
  CHECK(gx.stop_token().stop_requested());
  // y's heartbeats went on meanwhile, on their own thread.
  CHECK_FALSE(gy.lost());
  CHECK(y.held());
  server->unhang("x");
}

TEST_CASE("stop callbacks may call back into the guard and the mutex", "[guarantee][callbacks]") {
  SECTION("virtual time: the lease runs out during a partition") {
    Simulation sim;
    Instance a = sim.instance(slow_statements("a"), RecordingMetrics{});
    a.create_schema();
    auto guard = a.try_acquire();
    bool ran = false;
    std::stop_callback on_stop(guard.stop_token(), [&] {
      CHECK(guard.lost());
      CHECK_FALSE(a.held());
      CHECK_FALSE(a.inspect(nothrow));  // partitioned: an error, not a deadlock
      CHECK(guard.release(nothrow).error() == Errc::backend_unavailable);
      ran = true;
    });
    sim.server().partition("a");
    sim.advance(45s);
    CHECK(ran);
    CHECK_FALSE(guard.owns_lock());
  }
  SECTION("real threads: the lease runs out while a heartbeat hangs") {
    auto server = MemoryServer::create();
    RealMutex x(MemoryBackend(server, "x"), real_options("x", "holder"));
    x.create_schema();
    auto guard = x.try_acquire();
    std::atomic<bool> ran{false};
    std::stop_callback on_stop(guard.stop_token(), [&] {
      (void)guard.lost();
      (void)x.held();
      (void)x.inspect(nothrow);  // waits for the hung heartbeat's own timeout, then runs
      (void)guard.release(nothrow);
      ran = true;
    });
    server->hang("x");
    CHECK(eventually([&] { return guard.lost(); }));
    server->unhang("x");  // or the hung heartbeat's retries keep the inspect waiting
    CHECK(eventually([&] { return ran.load(); }));
  }
}

namespace {

// A metrics sink whose hooks call back into the mutex.
struct CallingBack {
  std::function<void()> on_lost;
  std::function<void()> on_failed;
  void lost(std::string_view, std::string_view, const Error&) {
    if (on_lost) on_lost();
  }
  void heartbeat_failed(std::string_view, std::string_view, const Error&) {
    if (on_failed) on_failed();
  }
};

}  // namespace

TEST_CASE("metrics hooks and singleton bodies may call back into the mutex", "[guarantee][callbacks]") {
  Simulation sim;
  auto calls = std::make_shared<int>(0);
  auto a = sim.instance(slow_statements("a"), CallingBack{});
  a.create_schema();
  a.metrics().on_lost = [&a, calls] {
    (void)a.held();
    (void)a.inspect(nothrow);
    (void)a.heartbeat(nothrow);
    ++*calls;
  };
  a.metrics().on_failed = [&a, calls] {
    (void)a.held();
    ++*calls;
  };

  auto job = a.singleton([&](BasicSimMutex<CallingBack>::guard_type& guard) {
    CHECK(a.held());
    CHECK(a.inspect()->fence == guard.fence());
    guard.heartbeat();
    sim.server().partition("a");
    sim.advance(45s);  // the hooks run in here, the lease runs out
    CHECK(guard.lost());
  });
  CHECK(job());
  CHECK(*calls >= 2);
}

TEST_CASE("a guard outlives its mutex, and a singleton its mutex's move", "[guarantee][lifetime]") {
  Simulation sim;
  auto observer = sim.connection();
  SECTION("guard") {
    Instance::guard_type guard;
    {
      Instance a = sim.instance(slow_statements("a"), RecordingMetrics{});
      a.create_schema();
      guard = a.try_acquire();
    }
    sim.advance(120s);  // heartbeats go on without the mutex object
    CHECK_FALSE(guard.lost());
    CHECK(sim.server().peek(LockRef{"mutex_lock", "job"}));
    guard.release();
    CHECK_FALSE(sim.server().peek(LockRef{"mutex_lock", "job"}));
  }
  SECTION("singleton") {
    std::vector<Instance> moved;
    Instance a = sim.instance(slow_statements("a"), RecordingMetrics{});
    a.create_schema();
    int ran = 0;
    auto job = a.singleton([&] { ++ran; });
    moved.push_back(std::move(a));
    CHECK(job());
    moved.clear();
    CHECK(job());  // the wrapper shares the state: it still works
    CHECK(ran == 2);
  }
}

TEST_CASE("two objects with one instance_id never adopt each other's grant", "[guarantee][identity]") {
  Simulation sim;
  const auto options = slow_statements("same");
  Instance first(MemoryBackend(sim.server().shared_from_this(), "first"), options, sim.clock(), {}, sim.executor());
  Instance second(MemoryBackend(sim.server().shared_from_this(), "second"), options, sim.clock(), {}, sim.executor());
  first.create_schema();

  SECTION("an acquire in doubt that did not land") {
    sim.server().fail_next(2, Errc::outcome_unknown);  // the acquire and its read-back
    CHECK(first.try_acquire(nothrow).error() == Errc::outcome_unknown);
    auto theirs = second.try_acquire();
    REQUIRE(theirs);
    auto mine = first.try_acquire();  // the row is "same"'s, but not this object's
    CHECK_FALSE(mine);
    CHECK(mine.why() == Errc::lock_held);
    sim.advance(30s);
    CHECK_FALSE(theirs.lost());
  }
  SECTION("an acquire in doubt that landed is adopted by its own object only") {
    sim.server().plan({MemoryServer::Fault::lose_reply, MemoryServer::Fault::fail});
    CHECK(first.try_acquire(nothrow).error() == Errc::outcome_unknown);
    CHECK_FALSE(second.try_acquire());
    auto mine = first.try_acquire();
    REQUIRE(mine);
    CHECK(mine.fence() == sim.server().peek(LockRef{"mutex_lock", "job"})->fence);
  }
  SECTION("a row that landed after all is removed when its mutex goes") {
    sim.server().plan({MemoryServer::Fault::lose_reply, MemoryServer::Fault::fail});
    CHECK(first.try_acquire(nothrow).error() == Errc::outcome_unknown);
    CHECK(sim.server().peek(LockRef{"mutex_lock", "job"}));
    { Instance gone = std::move(first); }
    CHECK_FALSE(sim.server().peek(LockRef{"mutex_lock", "job"}));
    CHECK(second.try_acquire());
  }
}

TEST_CASE("the holder's stale threshold is kept with its grant", "[guarantee][threshold]") {
  Simulation sim;
  Instance patient = sim.instance(Options{.lock_name = "job", .instance_id = "patient"}, RecordingMetrics{});  // 600 s
  Instance hasty = sim.instance(Options{.lock_name = "job", .instance_id = "hasty", .heartbeat_interval = 500ms,
                                        .alert_threshold = 1s, .stale_threshold = 2s},
                                RecordingMetrics{});
  patient.create_schema();
  auto held = patient.try_acquire();
  REQUIRE(held);
  sim.server().partition("patient");  // paused: no heartbeats
  sim.advance(100s);
  CHECK_FALSE(hasty.try_acquire());  // 100 s > its 2 s, but not > the holder's 600 s
  sim.advance(501s);
  CHECK(held.lost());                // the holder gave up at its lease...
  CHECK(hasty.try_acquire());        // ...and the row is stale by the holder's own threshold
}

TEST_CASE("a stop callback may release a guard that outlived its mutex, from inside a manual heartbeat",
          "[guarantee][lifetime]") {
  Simulation sim;
  Instance::guard_type guard;
  {
    Instance a = sim.instance(slow_statements("a"), RecordingMetrics{});
    a.create_schema();
    guard = a.try_acquire();
  }
  std::stop_callback on_stop(guard.stop_token(), [&] { (void)guard.release(nothrow); });
  (void)sim.connection().force_release(LockRef{"mutex_lock", "job"});
  CHECK(guard.heartbeat(nothrow).error() == Errc::lock_not_held);  // finds the row gone; the callback frees all
  CHECK_FALSE(guard.owns_lock());
}

TEST_CASE("a guard answers for its own grant, whatever came after it", "[guarantee][generations]") {
  Simulation sim;
  Instance a = sim.instance(slow_statements("a"), RecordingMetrics{});
  a.create_schema();
  SECTION("released through the mutex: no longer true") {
    auto guard = a.try_acquire();
    a.release();
    CHECK_FALSE(guard);
    CHECK_FALSE(guard.lost());
  }
  SECTION("lost, then the mutex acquires and loses again: the first guard still says lost") {
    auto first = a.try_acquire();
    (void)sim.connection().force_release(LockRef{"mutex_lock", "job"});
    sim.advance(10s);  // its heartbeat finds the row gone
    REQUIRE(first.lost());
    auto second = a.try_acquire();
    REQUIRE(second);
    (void)sim.connection().force_release(LockRef{"mutex_lock", "job"});
    sim.advance(10s);
    CHECK(second.lost());
    CHECK(first.lost());
    CHECK_FALSE(first);
  }
}

TEST_CASE("asynchronous heartbeats: the lease counts from a beat the server surely kept", "[guarantee][async]") {
  Simulation sim;
  sim.server().set_asynchronous_heartbeats(9s);  // a slow WAL writer: still inside one 10 s interval
  Instance a = sim.instance(Options{.lock_name = "job", .instance_id = "a"}, RecordingMetrics{});  // lease 540 s
  a.create_schema();
  auto guard = a.try_acquire();
  SECTION("frequent manual heartbeats never starve the lease") {
    for (int i = 0; i < 700; ++i) {
      sim.advance(1s);
      guard.heartbeat();
    }
    CHECK_FALSE(guard.lost());
  }
  SECTION("a restart that forgets the last beat: the holder gives up before the row can be reclaimed") {
    sim.advance(25s);  // beats at 10 s and 20 s; the answer at 20 s shows nothing flushed past 11 s
    sim.server().partition("a");
    sim.advance(100s);  // t = 125 s
    sim.server().heal("a");
    sim.advance(7s);  // one beat gets through (its retry comes within 6.4 s), asynchronously...
    sim.server().partition("a");
    sim.server().restart();  // ...and the server crashes before making it durable
    const auto row = sim.server().peek(LockRef{"mutex_lock", "job"});
    REQUIRE(row);
    CHECK(row->seconds_since_heartbeat >= 100.0);  // back to the beat at 20 s: reclaimable at 620 s
    // The holder never counted from the forgotten beat, nor from the one at
    // 20 s (its witness was not yet flushed): from 10 s, lost at 550 s.
    sim.advance(417s);  // t = 549 s
    CHECK_FALSE(guard.lost());
    sim.advance(1s);
    CHECK(guard.lost());
  }
}

// wal_writer_delay at its largest, or a WAL writer that cannot keep up: the
// server acknowledges asynchronous heartbeats but shows none flushed. Time
// alone proves nothing, so without more the lease would end 540 s after the
// acquire on a healthy server; instead, once half the lease passed without
// proof, the next heartbeat commits synchronously.
TEST_CASE("a WAL writer that never catches up: a durable heartbeat at half the lease keeps the lock",
          "[guarantee][async]") {
  Simulation sim;
  sim.server().set_asynchronous_heartbeats(100h);
  RecordingMetrics record;
  Instance a = sim.instance(Options{.lock_name = "job", .instance_id = "a"}, record);  // lease 540 s, beats every 10 s
  a.create_schema();
  auto guard = a.try_acquire();
  REQUIRE(guard);
  sim.advance(30min);
  CHECK_FALSE(guard.lost());
  CHECK(record.count("lost") == 0);
  // A crash forgets at most the asynchronous beats since the last durable one (at most half a lease old).
  sim.server().restart();
  const auto row = sim.server().peek(LockRef{"mutex_lock", "job"});
  REQUIRE(row);
  CHECK(row->seconds_since_heartbeat <= 280.0);
  CHECK(row->seconds_since_heartbeat >= 10.0);  // it did forget some: the beats were asynchronous
}

// The lease_renewed hook tells each deadline the mutex enforces (pgmutex run
// hands it to its guard process): first the acquire's send plus the lease,
// then each later one a heartbeat earned; never later than when the lease
// is declared lost, whatever the server forgets.
namespace {
struct DeadlineLog {
  std::shared_ptr<std::vector<std::chrono::nanoseconds>> deadlines = std::make_shared<std::vector<std::chrono::nanoseconds>>();
  void lease_renewed(std::string_view, std::string_view, std::chrono::nanoseconds deadline) {
    deadlines->push_back(deadline);
  }
};
}  // namespace

TEST_CASE("lease_renewed tells each deadline the mutex enforces", "[guarantee][hooks]") {
  const bool asynchronous = GENERATE(false, true);
  CAPTURE(asynchronous);
  Simulation sim;
  if (asynchronous) sim.server().set_asynchronous_heartbeats(3s);
  DeadlineLog log;
  auto a = sim.instance(Options{.lock_name = "job", .instance_id = "a"}, log);  // lease 540 s, beats every 10 s
  a.create_schema();
  const auto acquired_at = sim.now().time_since_epoch();
  auto guard = a.try_acquire();
  REQUIRE(guard);
  REQUIRE(log.deadlines->size() == 1);
  CHECK(log.deadlines->front() == acquired_at + a.options().lease());
  sim.advance(60s);
  REQUIRE(log.deadlines->size() >= 4);
  CHECK(std::is_sorted(log.deadlines->begin(), log.deadlines->end()));
  CHECK(log.deadlines->back() > acquired_at + a.options().lease());
  CHECK(log.deadlines->back() <= sim.now().time_since_epoch() + a.options().lease());
  // Cut off: the last deadline told is when the lease is declared lost.
  sim.server().partition("a");
  const auto last = log.deadlines->back();
  sim.advance(last - sim.now().time_since_epoch() - 1ms);
  CHECK_FALSE(guard.lost());
  sim.advance(1ms);
  CHECK(guard.lost());
  CHECK(log.deadlines->back() == last);
}
