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

  auto gb = b.try_acquire();
  REQUIRE(gb);
  CHECK(gb.fence() > ga.fence());
  CHECK(gb.fence() == (Fence{1} << 40) + 2);  // the sequence went back to 1; the history term lifts it
  sim.advance(10min);
  CHECK_FALSE(kept.lost());
  CHECK(gb);
}
