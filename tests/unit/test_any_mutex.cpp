// AnyMutex and AnyGuard: code written once against AnyMutex& runs on the
// simulated world; every operation in both forms (one test body per
// scenario, run through each form, as Boost.MySQL's netfun_maker does);
// moves, a guard that outlives its mutex, Lockable. Virtual time.
#include "pgmutex/any_mutex.hpp"
#include "pgmutex/testing/recording_metrics.hpp"
#include "pgmutex/testing/simulation.hpp"

#include <catch2/catch.hpp>

#include <mutex>
#include <type_traits>
#include <vector>

using namespace pgmutex;
using namespace pgmutex::testing;
using namespace std::chrono_literals;

namespace {

Options opts(std::string instance, std::string lock = "nightly-report-job") {
  return Options{.lock_name = std::move(lock), .instance_id = std::move(instance)};
}

// The throwing form's exception, turned back into the Result the other form
// returns, so one test body checks both. The type must match the code.
template <class F>
auto as_result(F&& f) -> Result<std::invoke_result_t<F&>> {
  using T = std::invoke_result_t<F&>;
  try {
    if constexpr (std::is_void_v<T>) {
      f();
      return {};
    } else {
      return f();
    }
  } catch (const LockError& e) {
    const Error error(e.code(), e.what());
    try {
      throw_error(error);  // what the nothrow form's error would throw: the same type as e?
    } catch (const LockError& expected) {
      CHECK(typeid(expected) == typeid(e));
    }
    return tl::unexpected(error);
  }
}

// The error of a result that must have failed.
template <class T>
Error error_of(Result<T>&& result) {
  REQUIRE_FALSE(result.has_value());
  return std::move(result.error());
}

struct NothrowForm {
  static Result<void> create_schema(AnyMutex& m) { return m.create_schema(nothrow); }
  static Result<AnyGuard> try_acquire(AnyMutex& m) { return m.try_acquire(nothrow); }
  static Result<AnyGuard> acquire(AnyMutex& m, std::optional<AnyMutex::duration> timeout, std::stop_token stop = {}) {
    return m.acquire(nothrow, timeout, std::move(stop));
  }
  static Result<void> release(AnyMutex& m) { return m.release(nothrow); }
  static Result<void> heartbeat(AnyMutex& m) { return m.heartbeat(nothrow); }
  static Result<std::optional<LockRow>> inspect(AnyMutex& m) { return m.inspect(nothrow); }
  static Result<void> lock(AnyMutex& m) { return m.lock(nothrow); }
  static Result<bool> try_lock(AnyMutex& m) { return m.try_lock(nothrow); }
  static Result<void> unlock(AnyMutex& m) { return m.unlock(nothrow); }
  static Result<void> release(AnyGuard& g) { return g.release(nothrow); }
  static Result<void> heartbeat(AnyGuard& g) { return g.heartbeat(nothrow); }
};

struct ThrowingForm {
  static Result<void> create_schema(AnyMutex& m) { return as_result([&] { m.create_schema(); }); }
  static Result<AnyGuard> try_acquire(AnyMutex& m) { return as_result([&] { return m.try_acquire(); }); }
  static Result<AnyGuard> acquire(AnyMutex& m, std::optional<AnyMutex::duration> timeout, std::stop_token stop = {}) {
    return as_result([&] { return m.acquire(timeout, stop); });
  }
  static Result<void> release(AnyMutex& m) { return as_result([&] { m.release(); }); }
  static Result<void> heartbeat(AnyMutex& m) { return as_result([&] { m.heartbeat(); }); }
  static Result<std::optional<LockRow>> inspect(AnyMutex& m) { return as_result([&] { return m.inspect(); }); }
  static Result<void> lock(AnyMutex& m) { return as_result([&] { m.lock(); }); }
  static Result<bool> try_lock(AnyMutex& m) { return as_result([&] { return m.try_lock(); }); }
  // unlock() throws only when nothing is locked (see basic_mutex.hpp): a failed release is not thrown.
  static Result<void> unlock(AnyMutex& m) { return as_result([&] { m.unlock(); }); }
  static Result<void> release(AnyGuard& g) { return as_result([&] { g.release(); }); }
  static Result<void> heartbeat(AnyGuard& g) { return as_result([&] { g.heartbeat(); }); }
};

struct World {
  Simulation sim;
  AnyMutex a = sim.instance(opts("a"));
  AnyMutex b = sim.instance(opts("b"));
};

// Production code: compiled once, knows nothing of backends, clocks or executors.
// Publishes its result, fenced, only while this instance holds the lock.
bool publish_if_leader(AnyMutex& mutex, std::vector<Fence>& published) {
  auto guard = mutex.try_acquire();
  if (!guard) return false;
  published.push_back(guard.fence());
  return true;
}

}  // namespace

TEST_CASE("code written against AnyMutex& runs on simulated mutexes of any policies", "[any]") {
  Simulation sim;
  RecordingMetrics record;
  AnyMutex a = sim.instance(opts("a"));
  AnyMutex b = sim.instance(opts("b"), record);  // another BasicMutex type behind the same AnyMutex
  a.create_schema();
  std::vector<Fence> published;

  CHECK(publish_if_leader(a, published));
  auto crashed = a.try_acquire();  // a holds the lock, then its requests stop arriving
  sim.server().partition("a");
  CHECK_FALSE(publish_if_leader(b, published));
  sim.advance(9min);
  CHECK_FALSE(publish_if_leader(b, published));
  sim.advance(2min);  // past the 600 s stale threshold
  CHECK(publish_if_leader(b, published));
  CHECK(published == std::vector<Fence>{1, 3});
  CHECK(crashed.lost());
  CHECK(record.count("stale_reclaimed") == 1);
}

TEMPLATE_TEST_CASE("every operation of AnyMutex and AnyGuard, in each form", "[any][forms]", NothrowForm,
                   ThrowingForm) {
  using Form = TestType;
  World w;
  REQUIRE(Form::create_schema(w.a));
  REQUIRE(Form::create_schema(w.a));  // idempotent
  CHECK(w.a.lock_name() == "nightly-report-job");
  CHECK(w.a.instance_id() == "a");

  auto won = Form::try_acquire(w.a);
  REQUIRE(won);
  REQUIRE(*won);
  CHECK(won->owns_lock());
  CHECK(won->fence() == 1);
  CHECK_FALSE(won->lost());
  CHECK_FALSE(won->stop_token().stop_requested());
  CHECK(w.a.held());

  auto lost_try = Form::try_acquire(w.b);
  REQUIRE(lost_try);
  CHECK_FALSE(*lost_try);
  CHECK_FALSE(lost_try->owns_lock());
  CHECK(lost_try->why() == Errc::lock_held);
  REQUIRE(lost_try->holder());
  CHECK(lost_try->holder()->instance_id == "a");
  CHECK(lost_try->holder()->fence == 1);

  auto twice = Form::try_acquire(w.a);
  REQUIRE_FALSE(twice);
  CHECK(twice.error() == Errc::already_acquired);
  CHECK_THAT(twice.error().detail, Catch::Contains("lock 'nightly-report-job'"));

  w.sim.advance(5s);
  REQUIRE(Form::heartbeat(w.a));
  REQUIRE(Form::heartbeat(*won));
  auto row = Form::inspect(w.b);
  REQUIRE(row);
  REQUIRE(*row);
  CHECK((*row)->instance_id == "a");
  CHECK((*row)->seconds_since_heartbeat == Approx(0.0));

  const auto start = w.sim.now();
  auto timed_out = Form::acquire(w.b, 5s);
  REQUIRE(timed_out);
  CHECK_FALSE(*timed_out);
  CHECK(timed_out->why() == Errc::timeout);
  CHECK(w.sim.now() - start == 5s);

  std::stop_source stop;
  w.sim.executor().schedule_after(3s, [&] { stop.request_stop(); });
  auto cancelled = Form::acquire(w.b, std::nullopt, stop.get_token());
  REQUIRE(cancelled);
  CHECK_FALSE(*cancelled);
  CHECK(cancelled->why() == Errc::cancelled);

  REQUIRE(Form::release(w.a));  // the mutex releases its current grant...
  CHECK_FALSE(w.a.held());
  auto guard_release = Form::release(*won);  // ...so the guard has nothing left to release
  REQUIRE_FALSE(guard_release);
  CHECK(guard_release.error() == Errc::lock_not_held);
  auto again = Form::release(w.a);
  REQUIRE_FALSE(again);
  CHECK(again.error() == Errc::lock_not_held);
  auto no_beat = Form::heartbeat(w.a);
  REQUIRE_FALSE(no_beat);
  CHECK(no_beat.error() == Errc::lock_not_held);
  auto nobody = Form::inspect(w.b);
  REQUIRE(nobody);
  CHECK_FALSE(*nobody);

  auto second = w.a.try_acquire();
  w.sim.executor().schedule_after(20s, [&] { second.release(); });
  const auto wait_start = w.sim.now();
  auto waited = Form::acquire(w.b, 1min);
  REQUIRE(waited);
  REQUIRE(*waited);
  CHECK(w.sim.now() - wait_start >= 20s);
  CHECK(waited->fence() == 3);
  REQUIRE(Form::release(*waited));
  CHECK_FALSE(waited->owns_lock());
  CHECK_FALSE(w.b.held());
}

TEMPLATE_TEST_CASE("backend errors come through AnyMutex with the lock's name", "[any][forms][errors]", NothrowForm,
                   ThrowingForm) {
  using Form = TestType;
  Simulation sim;
  AnyMutex m = sim.instance(opts("a"));  // no create_schema: the table does not exist
  for (const Error& error : {error_of(Form::try_acquire(m)), error_of(Form::acquire(m, 1min))}) {
    CHECK(error == Errc::schema_missing);
    CHECK_THAT(error.detail, Catch::Contains("lock 'nightly-report-job'") && Catch::Contains("create_schema"));
  }
  CHECK(error_of(Form::inspect(m)) == Errc::schema_missing);
  CHECK(error_of(Form::lock(m)) == Errc::schema_missing);
  CHECK(error_of(Form::try_lock(m)) == Errc::schema_missing);
  REQUIRE(Form::create_schema(m));
  CHECK(Form::try_acquire(m));
}

TEMPLATE_TEST_CASE("Lockable through AnyMutex, in each form", "[any][forms][lockable]", NothrowForm, ThrowingForm) {
  using Form = TestType;
  World w;
  w.a.create_schema();
  auto not_locked = Form::unlock(w.a);
  REQUIRE_FALSE(not_locked);
  CHECK(not_locked.error() == Errc::lock_not_held);

  REQUIRE(Form::lock(w.a));
  REQUIRE(w.a.lock_guard() != nullptr);
  CHECK(w.a.lock_guard()->fence() == 1);
  CHECK(w.a.held());
  CHECK(error_of(Form::lock(w.a)) == Errc::already_acquired);
  auto busy = Form::try_lock(w.b);
  REQUIRE(busy);
  CHECK_FALSE(*busy);
  REQUIRE(Form::unlock(w.a));
  CHECK(w.a.lock_guard() == nullptr);

  auto free = Form::try_lock(w.b);
  REQUIRE(free);
  CHECK(*free);
  CHECK(w.b.lock_guard()->fence() == 2);
  REQUIRE(Form::unlock(w.b));
}

TEST_CASE("std::unique_lock and std::scoped_lock take AnyMutex, next to a SimMutex and a std::mutex",
          "[any][lockable]") {
  Simulation sim;
  AnyMutex report = sim.instance(opts("a", "report"));
  SimMutex cleanup = sim.instance(opts("a", "cleanup"));
  AnyMutex rival = sim.instance(opts("b", "report"));
  report.create_schema();
  std::mutex in_process;
  {
    std::scoped_lock all(report, cleanup, in_process);
    CHECK(report.held());
    CHECK(cleanup.held());
    CHECK_FALSE(in_process.try_lock());
    std::unique_lock other(rival, std::try_to_lock);
    CHECK_FALSE(other.owns_lock());
  }
  CHECK_FALSE(report.held());
  CHECK_FALSE(cleanup.held());
  CHECK(in_process.try_lock());
  in_process.unlock();
  std::unique_lock now_free(rival, std::try_to_lock);
  CHECK(now_free.owns_lock());
}

TEMPLATE_TEST_CASE("a lost lease shows through AnyGuard", "[any][forms][lost]", NothrowForm, ThrowingForm) {
  using Form = TestType;
  World w;
  w.a.create_schema();
  auto guard = w.a.acquire();
  auto stop = guard.stop_token();
  w.sim.server().partition("a");
  w.sim.advance(11min);
  CHECK(guard.lost());
  CHECK(stop.stop_requested());
  CHECK_FALSE(guard);
  CHECK(guard.owns_lock());  // lost, but still the guard's to give up
  w.sim.server().heal("a");
  CHECK(error_of(Form::heartbeat(guard)) == Errc::lock_not_held);
  auto taken = w.b.try_acquire();
  REQUIRE(taken);
  CHECK(taken.fence() > guard.fence());
  CHECK(error_of(Form::release(guard)) == Errc::lock_not_held);
  CHECK_FALSE(guard.owns_lock());
}

TEST_CASE("a moved AnyMutex keeps its grants; move-assigning over one releases its lock()", "[any][lifetime]") {
  World w;
  w.a.create_schema();
  auto guard = w.a.try_acquire();
  AnyMutex moved = std::move(w.a);
  CHECK(moved.held());
  CHECK(moved.lock_name() == "nightly-report-job");
  w.sim.advance(15min);  // the heartbeat goes on
  CHECK_FALSE(guard.lost());
  guard.heartbeat();
  guard.release();
  CHECK_FALSE(moved.held());

  moved.lock();
  AnyMutex twice_moved(std::move(moved));
  REQUIRE(twice_moved.lock_guard() != nullptr);
  CHECK(twice_moved.lock_guard()->fence() == 2);
  CHECK_FALSE(w.b.try_lock());
  twice_moved = w.sim.instance(opts("c", "another-lock"));  // the grant kept for lock() is released
  CHECK(twice_moved.lock_name() == "another-lock");
  CHECK(twice_moved.lock_guard() == nullptr);
  CHECK(w.b.try_lock());
  w.b.unlock();
}

TEST_CASE("an AnyGuard outlives its AnyMutex and still heartbeats and releases", "[any][lifetime]") {
  Simulation sim;
  auto observer = sim.connection();
  AnyGuard guard;
  {
    AnyMutex a = sim.instance(opts("a"));
    a.create_schema();
    guard = a.try_acquire();
  }
  sim.advance(20min);  // heartbeats go on without the mutex object
  CHECK(guard);
  CHECK_FALSE(guard.lost());
  auto row = observer.inspect(LockRef{"mutex_lock", "nightly-report-job"});
  REQUIRE(row);
  REQUIRE(*row);
  CHECK((*row)->seconds_since_heartbeat < 10.0);
  guard.release();
  row = observer.inspect(LockRef{"mutex_lock", "nightly-report-job"});
  REQUIRE(row);
  CHECK_FALSE(*row);
}

TEST_CASE("AnyGuard: empty by default, moves, and move-assignment releases what it held", "[any][guard]") {
  World w;
  w.a.create_schema();
  AnyGuard empty;
  CHECK_FALSE(empty);
  CHECK_FALSE(empty.owns_lock());
  CHECK(empty.why() == Errc::lock_held);
  CHECK_FALSE(empty.holder());
  CHECK(empty.fence() == 0);
  CHECK_FALSE(empty.stop_token().stop_possible());
  CHECK_THROWS_AS(empty.release(), LockNotHeldError);
  CHECK_THROWS_AS(empty.heartbeat(), LockNotHeldError);

  AnyGuard held = w.a.try_acquire();
  AnyGuard moved = std::move(held);
  CHECK_FALSE(held);  // NOLINT(bugprone-use-after-move): a moved-from guard is empty
  CHECK_FALSE(held.owns_lock());
  CHECK(moved);
  CHECK(moved.fence() == 1);
  moved = AnyGuard{};  // releases the grant
  CHECK_FALSE(w.a.held());
  CHECK(w.b.try_acquire());
}

TEST_CASE("wrapping a mutex that holds a grant keeps the grant and its guard", "[any][lifetime]") {
  Simulation sim;
  SimMutex direct = sim.instance(opts("a"));
  direct.create_schema();
  auto concrete = direct.try_acquire();
  AnyMutex any = std::move(direct);
  CHECK(any.held());
  AnyGuard erased(std::move(concrete));  // a concrete guard can be erased too
  CHECK(erased.fence() == 1);
  any.release();
  CHECK_FALSE(any.held());
  CHECK(error_of(erased.release(nothrow)) == Errc::lock_not_held);  // the mutex released it already
}

// Issue 20, section 2: singleton wherever the mutex is, AnyMutex included:
// under its own lock name and under one given per call (same backend and
// options), in both forms; the wrapper outlives its AnyMutex.
TEST_CASE("singleton on AnyMutex: its own lock, a lock name given per call, refused names", "[any][singleton]") {
  Simulation sim;
  AnyMutex a = sim.instance(opts("a"));
  AnyMutex b = sim.instance(opts("b"));
  a.create_schema();

  int runs = 0;
  auto job = b.singleton([&](AnyGuard& g) {
    CHECK(g.fence() > 0);
    return ++runs;
  });
  CHECK(job() == 1);
  CHECK_FALSE(b.held());
  auto held = a.try_acquire();
  REQUIRE(held);
  CHECK_FALSE(job());  // a holds b's lock name
  held.release();

  auto other = b.singleton("other-job", [&](std::stop_token stop) { return stop.stop_requested() ? -1 : ++runs; });
  auto held_again = a.try_acquire();  // the mutex's own lock: not the one the wrapper takes
  REQUIRE(held_again);
  CHECK(other() == 2);
  auto row_of_other = [&] {
    auto seen = sim.instance(opts("watcher", "other-job"));
    return seen.inspect();
  };
  CHECK_FALSE(row_of_other());  // released after the run
  auto waits = a.singleton("other-job", [&] {
    auto row = row_of_other();
    REQUIRE(row);
    CHECK(row->instance_id == "a");  // the AnyMutex's instance id
  }, WaitPolicy{.blocking = true, .timeout = 1s});
  CHECK(waits());
  held_again.release();

  auto refused = b.singleton(nothrow, std::string(65, 'n'), [] {});
  REQUIRE_FALSE(refused);
  CHECK(refused.error() == Errc::invalid_argument);
  CHECK(refused.error().detail.find("lock_name must be at most 64 characters, got 65") != std::string::npos);
  CHECK_THROWS_AS(b.singleton("", [] {}), InvalidArgumentError);

  { AnyMutex gone = std::move(b); }
  CHECK(job() == 3);  // the wrappers outlive the AnyMutex
  CHECK(other() == 4);
}
