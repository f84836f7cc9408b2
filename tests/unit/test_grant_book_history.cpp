// The lease across a failover (detail::GrantBook, BackendReportsHistory): a
// heartbeat answered in a new server history (a promoted standby) is proof by
// itself, since the backend commits it synchronously; nothing the earlier
// server acknowledged counts there any more. In the same history, a new
// session (a reconnect, a restart) only restarts the confirmation of
// asynchronous heartbeats.
#include "pgmutex/detail/grant_book.hpp"

#include <catch2/catch.hpp>

using namespace std::chrono_literals;
using pgmutex::Errc;
using pgmutex::Result;
using pgmutex::detail::ServerSession;

namespace {

using Time = std::chrono::steady_clock::time_point;
using Book = pgmutex::detail::GrantBook<Time>;

Time at(std::chrono::milliseconds ms) { return Time(ms); }

const Result<void> ok{};

struct Holder {
  Book book{27s, /*asynchronous=*/true, /*interval=*/1s};
  Book::Grant grant;

  Holder() {
    book.begin(7, 99, at(0ms), at(1s), ServerSession{1, 0});
    grant = *book.current();
  }
  void beat(std::chrono::milliseconds when, ServerSession where, const Result<void>& answer = ok) {
    (void)book.apply_beat(grant, at(when), at(when), answer, false, 1s, 100ms, where);
  }
  bool lost_at(std::chrono::milliseconds when) {
    (void)book.on_timer(at(when));
    return !book.holds();
  }
};

}  // namespace

TEST_CASE("a heartbeat in a new server history restarts the lease from itself", "[grant_book][failover]") {
  Holder h;
  h.beat(1s, {1, 0});
  h.beat(2s, {1, 0});
  h.beat(3s, {1, 0});  // confirms 1 s and 2 s: the lease counts from 2 s
  SECTION("same history: the lease ends 27 s after the last confirmed beat") { CHECK(h.lost_at(29s)); }
  SECTION("a reconnect to the same server: the new session's beat waits for confirmation") {
    h.beat(20s, {2, 0});
    CHECK(h.lost_at(29s));  // still counted from 2 s
  }
  SECTION("a failover: the first beat on the new server is the proof, counted from its send time") {
    h.beat(20s, {2, 1});
    CHECK_FALSE(h.lost_at(46s));
    CHECK(h.lost_at(47s));
  }
  SECTION("a failover: later asynchronous beats there are confirmed as usual") {
    h.beat(20s, {2, 1});
    h.beat(21s, {2, 1});
    h.beat(22s, {2, 1});
    CHECK_FALSE(h.lost_at(47s));
    CHECK(h.lost_at(48s));  // counted from 21 s, which 22 s confirmed
  }
  SECTION("a failover: the row is gone on the new server, so the lease is lost at once") {
    h.beat(20s, {2, 1}, pgmutex::fail(Errc::lock_not_held, "no row"));
    CHECK_FALSE(h.book.holds());
    CHECK(h.book.lost_reason() == Errc::lease_lost);
  }
}

// The same through SimMutex, on MemoryServer's simulated failover.
#include "pgmutex/testing/recording_metrics.hpp"
#include "pgmutex/testing/simulation.hpp"

TEST_CASE("simulated failover: a grant the standby lacks is lost at the next heartbeat, fences go on rising",
          "[grant_book][failover]") {
  using namespace pgmutex;
  using namespace pgmutex::testing;
  Simulation sim;
  RecordingMetrics record_a;
  auto a = sim.instance(Options{.lock_name = "job", .instance_id = "a"}, record_a);
  auto b = sim.instance(Options{.lock_name = "job", .instance_id = "b"});
  auto c = sim.instance(Options{.lock_name = "other", .instance_id = "c"});
  a.create_schema();
  auto kept = c.try_acquire();
  REQUIRE(kept);
  sim.server().replicate();  // the standby has c's grant, not a's
  auto ga = a.try_acquire();
  REQUIRE(ga);
  REQUIRE(ga.fence() == 2);
  sim.advance(30s);
  sim.server().fail_over();

  sim.advance(11s);  // a heartbeat fails with the connection, the retry finds no row
  CHECK(ga.lost());
  REQUIRE(record_a.count("lost") == 1);
  CHECK_THAT(record_a.events("lost")[0].other, Catch::Contains("row gone"));
  CHECK_FALSE(kept.lost());  // c's grant was replicated: its heartbeat proves it on the new server

  // The failover grace: the new primary grants nothing free until it has
  // known its history for the longest stale threshold (600 s here).
  auto refused = b.try_acquire();
  REQUIRE_FALSE(refused);
  CHECK(refused.why() == Errc::lock_held);
  REQUIRE(refused.holder());
  CHECK(refused.holder()->instance_id == failover_grace_holder);
  CHECK(refused.holder()->failover_grace_left_s == Approx(600.0));
  sim.advance(600s);

  auto gb = b.try_acquire();
  REQUIRE(gb);
  CHECK(gb.fence() > ga.fence());
  CHECK(gb.fence() == (Fence{1} << 40) + 2);  // the sequence went back to 1; the history term lifts it
  sim.advance(10min);
  CHECK_FALSE(kept.lost());
  CHECK(gb);
}

// The gap the failover grace closes: A's grant never reached the standby, and
// after the promotion A cannot reach the new primary either (a partition), so
// nothing tells A it lost: it believes it holds until its lease runs out. A
// rival B tries every 500 ms on the new primary. With the grace, B is refused
// until A's lease is surely over; without it (grace 0, as for synchronous
// replication), B would hold the lock while A still believes it does.
TEST_CASE("simulated async failover: a lost holder and a rival never both believe they hold the lock",
          "[grant_book][failover][grace]") {
  using namespace pgmutex;
  using namespace pgmutex::testing;
  const bool grace_on = GENERATE(true, false);
  CAPTURE(grace_on);
  Simulation sim;
  if (!grace_on) sim.server().set_failover_grace(0s);
  const Options o{.lock_name = "job", .heartbeat_interval = 1s, .alert_threshold = 10s, .stale_threshold = 20s};
  auto with_id = [&](std::string id) {
    Options x = o;
    x.instance_id = std::move(id);
    return x;
  };
  auto a = sim.instance(with_id("a"));
  auto b = sim.instance(with_id("b"));
  a.create_schema();
  sim.advance(1s);
  sim.server().replicate();  // before A's grant
  auto ga = a.try_acquire();
  REQUIRE(ga);
  sim.advance(5s);            // heartbeats acknowledged by the old primary alone
  sim.server().partition("a");
  sim.server().fail_over();

  bool both = false;
  std::optional<decltype(b.try_acquire())> gb;
  double first_refusal_left = 0;
  auto b_won_at = std::chrono::nanoseconds::max();
  const auto start = sim.server().server_now();
  for (int step = 0; step < 120 && !gb; ++step) {
    auto r = b.try_acquire(nothrow);
    if (!r) {  // the first statement after the failover fails as its connection did
      sim.advance(500ms);
      continue;
    }
    auto g = std::move(*r);
    if (g) {
      gb.emplace(std::move(g));
      b_won_at = sim.server().server_now() - start;
    } else {
      REQUIRE(g.why() == Errc::lock_held);
      REQUIRE(g.holder());
      if (first_refusal_left == 0) first_refusal_left = g.holder()->failover_grace_left_s;
    }
    both = both || (gb && ga && !ga.lost() && !(*gb).lost());
    sim.advance(500ms);
  }
  REQUIRE(gb);
  INFO("B won " << std::chrono::duration<double>(b_won_at).count() << " s after the failover");
  if (grace_on) {
    CHECK_FALSE(both);
    CHECK(first_refusal_left == Approx(20.0));        // the stale threshold: A's lease is shorter
    CHECK(b_won_at >= 20s);
    CHECK(ga.lost());
    CHECK((*gb).fence() > ga.fence());
  } else {
    CHECK(both);  // the gap: B holds while A still believes it does
    CHECK(b_won_at < 1s);
  }
  // Once healed, A's heartbeat finds no row of its grant on the new primary.
  sim.server().heal("a");
  sim.advance(3s);
  CHECK(ga.lost());
  CHECK_FALSE((*gb).lost());
}

TEST_CASE("simulated failover grace: a replicated holder keeps its lock and its row shows as its own",
          "[grant_book][failover][grace]") {
  using namespace pgmutex;
  using namespace pgmutex::testing;
  Simulation sim;
  auto a = sim.instance(Options{.lock_name = "job", .instance_id = "a", .heartbeat_interval = 1s, .alert_threshold = 10s, .stale_threshold = 20s});
  auto b = sim.instance(Options{.lock_name = "job", .instance_id = "b", .heartbeat_interval = 1s, .alert_threshold = 10s, .stale_threshold = 20s});
  a.create_schema();
  auto ga = a.try_acquire();
  REQUIRE(ga);
  sim.server().replicate();
  sim.server().fail_over();
  sim.advance(3s);
  auto refused = b.try_acquire();
  REQUIRE_FALSE(refused);
  REQUIRE(refused.holder());
  CHECK(refused.holder()->instance_id == "a");  // a live row names its holder, grace or not
  CHECK(refused.holder()->failover_grace_left_s == 0.0);
  sim.advance(60s);
  CHECK_FALSE(ga.lost());
  ga.release();
  CHECK(b.try_acquire());  // the grace is over
}
