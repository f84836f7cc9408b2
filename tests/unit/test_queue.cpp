// Waiting in line (issue 17) on the in-memory backend: FIFO, one wake-up per
// release, dead and frozen heads skipped, cancellation leaves no place, no
// barging, fences rising across handoffs, lost replies, std::scoped_lock and
// the singleton. Each blocking waiter runs as a spawned thread of the
// ManualExecutor (one runs at a time): virtual time, deterministic.
#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/testing/simulation.hpp"

#include <catch2/catch.hpp>

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using namespace pgmutex;
using namespace pgmutex::testing;
using namespace std::chrono_literals;

namespace {

constexpr const char* lock_name = "nightly-report-job";

Options opts(std::string instance, std::string lock = lock_name) {
  return Options{.lock_name = std::move(lock), .instance_id = std::move(instance)};
}

// A holder that is a bare connection: it makes no heartbeat, so every
// operation the server counts meanwhile is a waiter's.
struct RawHolder {
  MemoryBackend connection;
  std::string lock;
  Fence fence = 0;
  RawHolder(Simulation& sim, std::string lock_ = lock_name) : connection(sim.connection("raw")), lock(std::move(lock_)) {
    auto got = connection.try_acquire(AcquireRequest{LockRef{"mutex_lock", lock}, "raw", 600s, 77});
    REQUIRE(got);
    REQUIRE(got->acquired);
    fence = got->fence;
  }
  void release() { REQUIRE(connection.release(HolderKey{LockRef{"mutex_lock", lock}, "raw", fence, 77})); }
};

struct World {
  Simulation sim;
  SimMutex a = sim.instance(opts("a"));
  World() { a.create_schema(); }
  // An instance whose tasks can be held back (pause) and connection killed.
  SimMutex waiter(const std::string& name, std::string lock = lock_name) {
    return sim.instance(opts(name, std::move(lock)), NoMetrics{}, 1.0);
  }
  std::vector<MemoryServer::QueueEntry> queue(std::string lock = lock_name) {
    return sim.server().peek_queue(LockRef{"mutex_lock", lock});
  }
  std::optional<LockRow> row(std::string lock = lock_name) { return sim.server().peek(LockRef{"mutex_lock", lock}); }
};

// A blocking acquire running as a spawned thread; what it got.
struct Waiting {
  std::optional<Result<SimMutex::guard_type>> got;
  ManualClock::time_point at{};
};
void wait_in(World& w, SimMutex& m, Waiting& out, std::optional<std::chrono::nanoseconds> timeout,
             std::stop_token stop = {}) {
  w.sim.executor().spawn([&w, &m, &out, timeout, stop] {
    out.got = m.acquire(nothrow, timeout, stop);
    out.at = w.sim.now();
  });
  w.sim.executor().run_due();  // it tries, queues and waits
}

}  // namespace

TEST_CASE("waiters are served in the order they queued, each with a higher fence", "[queue]") {
  World w;
  RawHolder raw(w.sim);
  auto b = w.waiter("b"), c = w.waiter("c"), d = w.waiter("d");
  Waiting wb, wc, wd;
  wait_in(w, d, wd, 300s);
  w.sim.advance(1s);
  wait_in(w, b, wb, 300s);
  w.sim.advance(1s);
  wait_in(w, c, wc, 300s);
  REQUIRE(w.queue().size() == 3);
  CHECK(w.queue()[0].instance_id == "d");
  raw.release();
  std::vector<std::string> order;
  std::vector<Fence> fences{raw.fence};
  for (int turn = 0; turn < 3; ++turn) {
    w.sim.advance(2s);
    for (auto* x : {&wb, &wc, &wd})
      if (x->got && *x->got && **x->got && std::find(fences.begin(), fences.end(), (*x->got)->fence()) == fences.end()) {
        order.push_back(w.row()->instance_id);
        fences.push_back((*x->got)->fence());
        CHECK((*x->got)->release(nothrow));
      }
  }
  CHECK(order == std::vector<std::string>{"d", "b", "c"});
  REQUIRE(fences.size() == 4);
  for (std::size_t i = 1; i < fences.size(); ++i) CHECK(fences[i] > fences[i - 1]);
  CHECK(w.queue().empty());
  CHECK_FALSE(w.row());
  CHECK(w.sim.executor().running() == 0);
}

TEST_CASE("waiters make no operation while they wait, and a release wakes only the head", "[queue]") {
  World w;
  RawHolder raw(w.sim);
  auto b = w.waiter("b"), c = w.waiter("c"), d = w.waiter("d");
  Waiting wb, wc, wd;
  wait_in(w, b, wb, 1000s);
  wait_in(w, c, wc, 1000s);
  wait_in(w, d, wd, 1000s);
  REQUIRE(w.queue().size() == 3);
  const auto before = w.sim.server().operations();
  w.sim.advance(100s);
  CHECK(w.sim.server().operations() == before);  // three waiters, 100 s: no statement
  raw.release();
  w.sim.advance(1s);
  // The release and the head's confirm; c and d made none.
  CHECK(w.sim.server().operations() == before + 2);
  REQUIRE(wb.got);
  REQUIRE(*wb.got);
  CHECK(**wb.got);
  CHECK(w.queue().size() == 2);
  CHECK_FALSE(wc.got);
  // Each later release: the release and one confirm again.
  const auto then = w.sim.server().operations();
  CHECK((*wb.got)->release(nothrow));
  w.sim.advance(1s);
  CHECK(w.sim.server().operations() == then + 2);
  REQUIRE(wc.got);
  CHECK(**wc.got);
  CHECK((*wc.got)->release(nothrow));
  w.sim.advance(1s);
  REQUIRE(wd.got);
  CHECK(**wd.got);
  CHECK((*wd.got)->release(nothrow));
  CHECK(w.sim.executor().running() == 0);
}

TEST_CASE("a killed head is skipped by the very next release", "[queue]") {
  World w;
  RawHolder raw(w.sim);
  auto b = w.waiter("b"), c = w.waiter("c");
  Waiting wb, wc;
  wait_in(w, b, wb, 30s);
  wait_in(w, c, wc, 30s);
  w.sim.server().kill_connection("b");
  REQUIRE(w.queue().size() == 2);
  CHECK_FALSE(w.queue()[0].alive);
  raw.release();
  // Offered to c at once; b's place swept with the release.
  REQUIRE(w.row());
  CHECK(w.row()->instance_id == "c");
  REQUIRE(w.queue().size() == 1);
  CHECK(w.queue()[0].instance_id == "c");
  CHECK(w.queue()[0].offered_fence == w.row()->fence);
  w.sim.advance(1s);
  REQUIRE(wc.got);
  REQUIRE(*wc.got);
  CHECK(**wc.got);
  CHECK((*wc.got)->fence() > raw.fence);
  w.sim.advance(40s);  // b's acquire gives up at its timeout: its connection is gone
  REQUIRE(wb.got);
  CHECK_FALSE((*wb.got && static_cast<bool>(**wb.got)));
  CHECK((*wc.got)->release(nothrow));
  CHECK(w.sim.executor().running() == 0);
}

TEST_CASE("a frozen head loses its turn after the handoff deadline; the next live waiter gets the lock",
          "[queue]") {
  World w;
  RawHolder raw(w.sim);
  auto b = w.waiter("b"), c = w.waiter("c");
  const auto deadline = b.options().handoff_deadline;
  CHECK(deadline == 2s);
  const auto poll = c.options().poll_interval;
  Waiting wb, wc;
  wait_in(w, b, wb, 60s);
  wait_in(w, c, wc, 60s);
  SECTION("stopped and hung") {
    w.sim.pause("b");
    w.sim.server().hang("b");
  }
  SECTION("partitioned") { w.sim.server().partition("b"); }
  const auto released = w.sim.now();
  raw.release();
  REQUIRE(w.row()->instance_id == "b");  // offered to b: it is alive, only frozen
  const Fence offered = w.row()->fence;
  w.sim.advance(deadline - 100ms);
  CHECK(w.row()->instance_id == "b");
  CHECK_FALSE(wc.got);
  w.sim.advance(100ms + 2 * poll);
  REQUIRE(wc.got);
  REQUIRE(*wc.got);
  REQUIRE(**wc.got);
  CHECK(wc.at - released <= deadline + poll);
  CHECK((*wc.got)->fence() > offered);
  CHECK(w.row()->instance_id == "c");
  // b thaws: its late confirm finds its place gone; it queues again, and
  // never holds while c does.
  w.sim.resume("b");
  w.sim.server().unhang("b");
  w.sim.server().heal("b");
  w.sim.advance(5s);
  CHECK(w.row()->instance_id == "c");
  CHECK_FALSE(wb.got);
  REQUIRE(w.queue().size() == 1);
  CHECK(w.queue()[0].instance_id == "b");
  CHECK((*wc.got)->release(nothrow));
  w.sim.advance(1s);
  REQUIRE(wb.got);
  REQUIRE(*wb.got);
  CHECK(**wb.got);
  CHECK((*wb.got)->fence() > (*wc.got)->fence());
  CHECK((*wb.got)->release(nothrow));
  CHECK(w.sim.executor().running() == 0);
}

TEST_CASE("a waiter that times out or is cancelled leaves no place in the queue", "[queue]") {
  World w;
  RawHolder raw(w.sim);
  auto b = w.waiter("b"), c = w.waiter("c");
  Waiting wb, wc;
  std::stop_source stop;
  wait_in(w, b, wb, 5s);
  wait_in(w, c, wc, std::nullopt, stop.get_token());
  CHECK(w.queue().size() == 2);
  w.sim.advance(6s);
  REQUIRE(wb.got);
  REQUIRE(*wb.got);
  CHECK((*wb.got)->why() == Errc::timeout);
  REQUIRE(w.queue().size() == 1);
  CHECK(w.queue()[0].instance_id == "c");
  stop.request_stop();
  w.sim.advance(1s);
  REQUIRE(wc.got);
  REQUIRE(*wc.got);
  CHECK((*wc.got)->why() == Errc::cancelled);
  CHECK(w.queue().empty());
  SECTION("cancelled after a release offered it the lock: the offer passes on") {
    auto d = w.waiter("d"), e = w.waiter("e");
    Waiting wd, we;
    std::stop_source stop_d;
    wait_in(w, d, wd, std::nullopt, stop_d.get_token());
    wait_in(w, e, we, 60s);
    w.sim.pause("d");  // it cannot confirm in time
    raw.release();
    CHECK(w.row()->instance_id == "d");
    stop_d.request_stop();
    w.sim.resume("d");
    w.sim.advance(1s);
    REQUIRE(wd.got);
    REQUIRE(*wd.got);
    CHECK((*wd.got)->why() == Errc::cancelled);
    REQUIRE(we.got);
    REQUIRE(*we.got);
    CHECK(**we.got);
    CHECK(w.row()->instance_id == "e");
    CHECK(w.queue().empty());
    CHECK((*we.got)->release(nothrow));
  }
  CHECK(w.sim.executor().running() == 0);
}

TEST_CASE("try_acquire loses to a live waiter and to an offer not yet confirmed", "[queue]") {
  World w;
  RawHolder raw(w.sim);
  auto b = w.waiter("b"), c = w.waiter("c");
  Waiting wb;
  wait_in(w, b, wb, 60s);
  auto held = c.try_acquire(nothrow);
  REQUIRE(held);
  CHECK_FALSE(*held);
  raw.release();  // offered to b, not confirmed yet
  const auto before = w.sim.server().operations();
  auto offered = c.try_acquire(nothrow);
  REQUIRE(offered);
  CHECK_FALSE(*offered);
  REQUIRE(offered->holder());
  CHECK(offered->holder()->instance_id == "b");
  CHECK(w.sim.server().operations() == before + 1);
  CHECK(w.queue().size() == 1);  // the losing try wrote nothing
  w.sim.advance(1s);
  REQUIRE(wb.got);
  REQUIRE(*wb.got);
  CHECK(**wb.got);
  CHECK((*wb.got)->release(nothrow));
  auto free_again = c.try_acquire(nothrow);  // nobody waits: a plain try takes it
  REQUIRE(free_again);
  CHECK(*free_again);
}

TEST_CASE("a queued try whose reply is lost is tried again, never making two holders", "[queue][failure]") {
  World w;
  RawHolder raw(w.sim);
  auto b = w.waiter("b"), c = w.waiter("c");
  Waiting wb, wc;
  wait_in(w, b, wb, 60s);
  wait_in(w, c, wc, 60s);
  raw.release();
  const Fence offered = w.row()->fence;
  w.sim.server().plan({MemoryServer::Fault::lose_reply});  // b's confirm lands; its reply is lost
  w.sim.advance(1s);
  REQUIRE(wb.got);
  REQUIRE(*wb.got);
  REQUIRE(**wb.got);
  CHECK((*wb.got)->fence() == offered);
  CHECK_FALSE(wc.got);
  CHECK(w.row()->instance_id == "b");
  w.sim.advance(10s);
  CHECK_FALSE(wc.got);
  CHECK((*wb.got)->release(nothrow));
  w.sim.advance(1s);
  REQUIRE(wc.got);
  REQUIRE(*wc.got);
  CHECK(**wc.got);
  CHECK((*wc.got)->fence() > offered);
  CHECK((*wc.got)->release(nothrow));
}

TEST_CASE("std::scoped_lock queues on two mutexes held elsewhere", "[queue][lockable]") {
  World w;
  RawHolder first(w.sim, "first"), second(w.sim, "second");
  auto one = w.waiter("b", "first"), two = w.waiter("b", "second");
  bool locked = false;
  w.sim.executor().spawn([&] {
    std::scoped_lock both(one, two);
    locked = one.held() && two.held();
  });
  w.sim.executor().run_due();
  w.sim.advance(10s);
  first.release();
  w.sim.advance(10s);
  CHECK_FALSE(locked);
  second.release();
  w.sim.advance(10s);
  CHECK(locked);
  CHECK_FALSE(one.held());
  CHECK_FALSE(two.held());
  CHECK(w.queue("first").empty());
  CHECK(w.queue("second").empty());
  CHECK(w.sim.executor().running() == 0);
}

TEST_CASE("the singleton's blocking form waits in line", "[queue][singleton]") {
  World w;
  RawHolder raw(w.sim);
  auto b = w.waiter("b");
  std::optional<int> ran;
  w.sim.executor().spawn([&] {
    auto job = b.singleton([] { return 7; }, WaitPolicy{.blocking = true, .timeout = 60s});
    ran = job();
  });
  w.sim.executor().run_due();
  REQUIRE(w.queue().size() == 1);
  w.sim.advance(5s);
  CHECK_FALSE(ran);
  raw.release();
  w.sim.advance(1s);
  CHECK(ran == 7);
  CHECK(w.queue().empty());
  CHECK_FALSE(w.row());
}

namespace {

// A memory backend that blocks in the queue as Postgres's does
// (BackendWaitsInQueue) and misses every wake-up: each wait runs `meanwhile`
// (say, the holder releasing), then says its limit passed. After three of
// them it reports a stop, so that a waiter that never looks ends.
struct MissedWakes : MemoryBackend {
  explicit MissedWakes(MemoryBackend b) : MemoryBackend(std::move(b)) {}
  std::function<void()> meanwhile;
  int waits = 0;
  Result<QueueWake> wait_in_queue(const WatchRequest&, std::int64_t, std::chrono::nanoseconds,
                                  std::stop_token) noexcept {
    if (++waits > 3) return QueueWake::stopped;
    if (meanwhile) std::exchange(meanwhile, nullptr)();
    return QueueWake::timed_out;
  }
};
static_assert(BackendWaitsInQueue<MissedWakes>);

}  // namespace

TEST_CASE("a waiter without a timeout looks again when its hourly limit passes, so a missed wake-up ends",
          "[queue]") {
  World w;
  RawHolder raw(w.sim);
  MissedWakes backend(w.sim.connection("b"));
  backend.meanwhile = [&raw] { raw.release(); };  // its offer's wake-up is the one missed
  BasicMutex<MissedWakes, ManualClock, NoMetrics, ManualExecutor> b(std::move(backend), opts("b"), w.sim.clock(),
                                                                      NoMetrics{}, w.sim.executor());
  auto got = b.acquire(nothrow);
  REQUIRE(got);
  CHECK(*got);  // before the fix: three hours without a look, then cancelled
  CHECK(w.row()->instance_id == "b");
  CHECK(w.queue().empty());
}

namespace {

// A server whose heartbeats and confirms commit asynchronously (a 30 s WAL
// writer), with the lock table made.
void confirm_unflushed(Simulation& sim) {
  sim.server().set_asynchronous_heartbeats(30s);
  sim.server().set_unflushed_confirms(250ms);
  sim.instance(opts("admin")).create_schema();
}

}  // namespace

// The in-memory model of a confirm that skips its flush
// (MemoryServer::set_unflushed_confirms, as PostgresBackend's): the grant is
// provisional for what the offer has left; a restart before the confirm is
// durable brings the place back, offered, and nobody else is granted the lock
// before the offer lapses. After a synchronous commit, or the WAL writer's
// round, a restart keeps it.
TEST_CASE("a confirm committed asynchronously is provisional, and a restart before its flush brings the offer back",
          "[queue][provisional]") {
  Simulation sim;
  confirm_unflushed(sim);
  RawHolder raw(sim);
  const LockRef lock{"mutex_lock", lock_name};
  const auto request = [&](MemoryBackend& on, const char* name, GrantToken token) {
    AcquireRequest r{lock, name, 600s, token};
    auto place = on.enqueue(r, 10s);
    REQUIRE(place);
    r.queue_ticket = place->ticket;
    return r;
  };
  MemoryBackend w = sim.connection("w"), c = sim.connection("c");
  const AcquireRequest wr = request(w, "w", 0x22), cr = request(c, "c", 0x33);
  raw.release();  // offered to w until 10 s from now
  sim.advance(1s);
  auto won = w.try_acquire(wr);
  REQUIRE(won);
  REQUIRE(won->acquired);
  CHECK(won->provisional_for == 9s);  // what the offer has left
  CHECK(sim.server().peek_queue(lock).size() == 1);  // w's place went with the confirm
  const auto counts_before = sim.server().unflushed_confirm_counts();
  CHECK(counts_before.made == 1);

  SECTION("a restart before the flush: the offer stands again until its deadline") {
    sim.server().restart();
    CHECK(sim.server().unflushed_confirm_counts().taken_back == 1);
    const auto line = sim.server().peek_queue(lock);
    REQUIRE(line.size() == 2);
    CHECK(line[0].instance_id == "w");
    CHECK(line[0].offered_fence == won->fence);
    auto early = c.try_acquire(cr);
    if (!early) early = c.try_acquire(cr);  // the restart failed the first statement of each connection
    REQUIRE(early);
    CHECK_FALSE(early->acquired);
    sim.advance(9s - 1ms);  // w's provisional end: 10 s after the release
    auto still = c.try_acquire(cr);
    REQUIRE(still);
    CHECK_FALSE(still->acquired);
    sim.advance(2ms);
    auto after = c.try_acquire(cr);
    REQUIRE(after);
    CHECK(after->acquired);
    CHECK(after->fence > won->fence);
  }
  SECTION("a synchronous commit first (any row's): the restart keeps the grant") {
    REQUIRE(w.heartbeat(HolderKey{lock, "w", won->fence, 0x22, 0s, /*durable=*/true}));
    sim.server().restart();
    CHECK(sim.server().unflushed_confirm_counts().taken_back == 0);
    CHECK(sim.server().peek_queue(lock).size() == 1);
    CHECK(sim.server().peek(lock)->instance_id == "w");
  }
  SECTION("the WAL writer's round first: the restart keeps the grant") {
    sim.advance(31s);
    sim.server().restart();
    CHECK(sim.server().unflushed_confirm_counts().taken_back == 0);
    CHECK(sim.server().peek(lock)->instance_id == "w");
  }
}

namespace {

// Each lease deadline a mutex announces (the lease_renewed hook).
struct LeaseDeadlines {
  std::shared_ptr<std::vector<std::chrono::nanoseconds>> seen = std::make_shared<std::vector<std::chrono::nanoseconds>>();
  void lease_renewed(std::string_view, std::string_view, std::chrono::nanoseconds deadline) { seen->push_back(deadline); }
};

}  // namespace

// A provisional grant ends short of the offer's deadline by the margin every
// lease keeps: the share of the bound that the lease is of the stale
// threshold (a client clock slower than the server's must not outlast the
// offer). Its first heartbeat, at once, gives it the whole lease.
TEST_CASE("a provisional grant ends at the lease's share of what the offer has left, until its first heartbeat",
          "[queue][provisional]") {
  Simulation sim;
  confirm_unflushed(sim);
  RawHolder raw(sim);
  Options o = opts("w");
  o.stale_threshold = 100s;
  o.safety_margin = 20s;  // lease 80 s: 80% of the stale threshold
  o.handoff_deadline = 10s;
  LeaseDeadlines deadlines;
  auto w = sim.instance(o, deadlines, 1.0);
  std::optional<Result<BasicSimMutex<LeaseDeadlines>::guard_type>> got;
  sim.executor().spawn([&] { got = w.acquire(nothrow, std::chrono::nanoseconds(60s)); });
  sim.executor().run_due();  // it queues
  const auto released = sim.now().time_since_epoch();
  raw.release();  // the offer stands 10 s
  sim.advance(1s);
  REQUIRE(got);
  REQUIRE(*got);
  REQUIRE(deadlines.seen->size() >= 1);
  // Confirmed d after the release (the waiter's wake-up, under 1 s), with
  // 10 s - d left: the lease ends d + 80% of that after the release, where
  // without the margin it would end with the offer, 10 s after it.
  const auto first = deadlines.seen->front() - released;
  CHECK(first >= 8s);
  CHECK(first <= 8200ms);
  REQUIRE(deadlines.seen->size() == 2);  // the first heartbeat, at once, lifted it
  CHECK(deadlines.seen->back() - released >= 80s);
  CHECK((*got)->release(nothrow));
}
