// BasicMutex as a standard Lockable: std::unique_lock, std::scoped_lock and
// std::lock drive lock(), try_lock() and unlock(); the grant they take stays
// reachable through lock_guard(). Virtual time: nothing here sleeps.
#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/testing/simulation.hpp"

#include <catch2/catch.hpp>

#include <mutex>

using namespace pgmutex;
using namespace pgmutex::testing;
using namespace std::chrono_literals;

namespace {

Options opts(std::string instance, std::string lock = "nightly-report-job") {
  return Options{.lock_name = std::move(lock), .instance_id = std::move(instance)};
}

double seconds_since_epoch(ManualClock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

struct World {
  Simulation sim;
  SimMutex a = sim.instance(opts("a"));
  SimMutex b = sim.instance(opts("b"));
  World() { a.create_schema(); }
};

}  // namespace

TEST_CASE("std::unique_lock locks, unlocks on scope exit, and tries", "[lockable]") {
  World w;
  {
    std::unique_lock lock(w.a);
    CHECK(lock.owns_lock());
    CHECK(w.a.held());
    REQUIRE(w.a.lock_guard() != nullptr);
    CHECK(w.a.lock_guard()->fence() == 1);
    CHECK_FALSE(w.a.lock_guard()->lost());

    std::unique_lock other(w.b, std::try_to_lock);  // another instance: one try, false
    CHECK_FALSE(other.owns_lock());
    CHECK(w.b.lock_guard() == nullptr);
  }
  CHECK_FALSE(w.a.held());
  CHECK(w.a.lock_guard() == nullptr);
  CHECK_FALSE(w.b.inspect());  // the row is gone, not just forgotten

  std::unique_lock deferred(w.b, std::defer_lock);
  deferred.lock();
  CHECK(w.b.lock_guard()->fence() == 2);
  deferred.unlock();
  CHECK_FALSE(w.b.held());
}

TEST_CASE("std::scoped_lock of three free mutexes takes all three and gives them back", "[lockable]") {
  Simulation sim;
  auto first = sim.instance(opts("a", "first"));
  auto second = sim.instance(opts("a", "second"));
  auto third = sim.instance(opts("a", "third"));
  first.create_schema();
  {
    std::scoped_lock all(first, second, third);
    CHECK(first.held());
    CHECK(second.held());
    CHECK(third.held());
  }
  CHECK_FALSE(first.held());
  CHECK_FALSE(second.held());
  CHECK_FALSE(third.held());
  auto rows = sim.connection().list("mutex_lock");
  REQUIRE(rows);
  CHECK(rows->empty());
}

TEST_CASE("std::scoped_lock waits out a crashed holder of one of its mutexes", "[lockable][wait]") {
  World w;
  auto job_b = w.sim.instance(opts("b", "other-job"));
  auto crashed = w.a.try_acquire();
  w.sim.server().partition("a");

  // std::lock's algorithm: lock one, try the other, back off and block on the
  // one that failed. Blocking waits in virtual time until a's row is stale.
  {
    std::scoped_lock both(w.b, job_b);
    CHECK(seconds_since_epoch(w.sim.now()) >= 600.0);
    REQUIRE(w.b.lock_guard() != nullptr);
    CHECK(w.b.lock_guard()->fence() > crashed.fence());
    CHECK(job_b.held());
  }
  CHECK_FALSE(w.b.held());
  CHECK_FALSE(job_b.held());
}

TEST_CASE("unlock without lock, and locking twice, are errors in both forms", "[lockable][errors]") {
  World w;
  auto not_locked = w.a.unlock(nothrow);
  REQUIRE_FALSE(not_locked);
  CHECK(not_locked.error() == Errc::lock_not_held);
  CHECK_THAT(not_locked.error().detail, Catch::Contains("lock 'nightly-report-job'"));
  CHECK_THROWS_AS(w.a.unlock(), LockNotHeldError);

  REQUIRE(w.a.lock(nothrow));
  auto again = w.a.lock(nothrow);
  REQUIRE_FALSE(again);
  CHECK(again.error() == Errc::already_acquired);
  CHECK_THROWS_AS(w.a.lock(), LockHeldError);
  CHECK_THROWS_AS(w.a.try_lock(), LockHeldError);
  CHECK(w.a.lock_guard()->fence() == 1);  // the first grant is untouched

  REQUIRE(w.a.unlock(nothrow));
  CHECK_THROWS_AS(w.a.unlock(), LockNotHeldError);

  // A grant taken by try_acquire() is not lock()'s to unlock.
  auto guard = w.a.try_acquire();
  CHECK_THROWS_AS(w.a.unlock(), LockNotHeldError);
  CHECK(guard);
}

TEST_CASE("try_lock: false when held elsewhere, true when free, both forms", "[lockable]") {
  World w;
  auto held = w.a.try_acquire();
  auto busy = w.b.try_lock(nothrow);
  REQUIRE(busy);
  CHECK_FALSE(*busy);
  CHECK_FALSE(w.b.try_lock());
  held.release();

  auto free = w.b.try_lock(nothrow);
  REQUIRE(free);
  CHECK(*free);
  w.b.unlock();
  CHECK(w.b.try_lock());
  w.b.unlock();
}

TEST_CASE("lock() and try_lock() throw on backend errors", "[lockable][errors]") {
  Simulation sim;
  auto m = sim.instance(opts("a"));  // no create_schema: every statement fails with schema_missing
  auto tried = m.try_lock(nothrow);
  REQUIRE_FALSE(tried);
  CHECK(tried.error() == Errc::schema_missing);
  CHECK_THROWS_AS(m.try_lock(), BackendError);
  auto locked = m.lock(nothrow);
  REQUIRE_FALSE(locked);
  CHECK(locked.error() == Errc::schema_missing);
  CHECK_THROWS_AS(m.lock(), BackendError);
  CHECK(m.lock_guard() == nullptr);
}

TEST_CASE("a lost lease shows through lock_guard(); unique_lock's unlock does not throw it", "[lockable][lost]") {
  World w;
  {
    std::unique_lock lock(w.a);
    const auto* guard = w.a.lock_guard();
    REQUIRE(guard != nullptr);
    auto stop = guard->stop_token();
    w.sim.server().partition("a");
    w.sim.advance(11min);  // the watchdog fires, and b may reclaim
    CHECK(guard->lost());
    CHECK(stop.stop_requested());
    CHECK_FALSE(w.a.held());
    REQUIRE(w.b.try_lock());
    w.sim.server().heal("a");
  }  // unique_lock's destructor calls unlock(): the failed release must not escape (it would terminate)
  CHECK(w.a.lock_guard() == nullptr);
  CHECK(w.b.held());
  w.b.unlock();
}

TEST_CASE("unlock(nothrow) reports a release that failed because the lease was lost", "[lockable][lost]") {
  World w;
  w.a.lock();
  w.sim.server().partition("a");
  w.sim.advance(11min);
  w.sim.server().heal("a");
  REQUIRE(w.b.try_lock());
  auto released = w.a.unlock(nothrow);
  REQUIRE_FALSE(released);
  CHECK(released.error() == Errc::lock_not_held);
  CHECK(w.a.lock_guard() == nullptr);  // the grant is given up all the same
  CHECK(w.b.held());
}

TEST_CASE("a locked mutex moves with its grant", "[lockable][lifetime]") {
  World w;
  w.a.lock();
  SimMutex moved = std::move(w.a);
  REQUIRE(moved.lock_guard() != nullptr);
  CHECK(moved.lock_guard()->fence() == 1);
  CHECK(moved.held());
  CHECK_FALSE(w.b.try_lock());
  moved.unlock();
  CHECK(w.b.try_lock());
  w.b.unlock();
}

TEST_CASE("a mutex destroyed while locked releases its grant", "[lockable][lifetime]") {
  World w;
  {
    auto temporary = w.sim.instance(opts("c"));
    temporary.lock();
    CHECK_FALSE(w.b.try_lock());
  }
  CHECK(w.b.try_lock());
  w.b.unlock();
}
