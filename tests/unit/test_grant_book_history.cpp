// The lease across a failover (detail::GrantBook, BackendReportsHistory): a
// heartbeat answered in a new server history (a promoted standby) is proof by
// itself, since the backend commits it synchronously; nothing the earlier
// server acknowledged counts there any more. In the same history, a new
// session (a reconnect, a restart) only restarts the confirmation of
// asynchronous heartbeats; a WAL flush position shows which are durable.
#include "pgmutex/detail/grant_book.hpp"

#include <catch2/catch.hpp>

using namespace std::chrono_literals;
using pgmutex::Errc;
using pgmutex::Result;
using pgmutex::detail::ServerSession;

namespace {

using Time = std::chrono::steady_clock::time_point;
using Book = pgmutex::detail::GrantBook<Time>;
using pgmutex::HeartbeatDurability;

Time at(std::chrono::milliseconds ms) { return Time(ms); }

const Result<void> ok{};

// Where an asynchronous heartbeat was answered: server session and history,
// and the WAL as the statement saw it when it began (log end, flushed).
ServerSession where(std::uint64_t session, std::uint64_t history, std::uint64_t wal_before = 0,
                    std::uint64_t wal_flushed = 0, bool durable = false) {
  return ServerSession{session, history, HeartbeatDurability{durable, wal_before, wal_flushed}};
}

struct Holder {
  Book book{27s, /*asynchronous=*/true};
  Book::Grant grant;

  Holder() {
    book.begin(7, 99, at(0ms), at(1s), ServerSession{1, 0});
    grant = *book.current(at(0ms));
  }
  void beat(std::chrono::milliseconds when, ServerSession where, const Result<void>& answer = ok) {
    (void)book.apply_beat(grant, at(when), at(when), answer, false, 1s, 100ms, where);
  }
  bool lost_at(std::chrono::milliseconds when) {
    (void)book.on_timer(at(when));
    return !book.holds(at(when));
  }
};

}  // namespace

TEST_CASE("a heartbeat in a new server history restarts the lease from itself", "[grant_book][failover]") {
  Holder h;
  h.beat(1s, where(1, 0, 100, 90));
  h.beat(2s, where(1, 0, 200, 150));  // witness of 1 s: 200, not yet flushed
  h.beat(3s, where(1, 0, 300, 300));  // flushed past both witnesses: the lease counts from 2 s
  SECTION("same history: the lease ends 27 s after the last confirmed beat") {
    CHECK_FALSE(h.lost_at(28s));
    CHECK(h.lost_at(29s));
  }
  SECTION("a reconnect to the same server: the new session's beat waits for confirmation") {
    h.beat(20s, where(2, 0, 400, 400));
    CHECK(h.lost_at(29s));  // still counted from 2 s
  }
  SECTION("a failover: the first beat on the new server is the proof, counted from its send time") {
    h.beat(20s, where(2, 1));
    CHECK_FALSE(h.lost_at(46s));
    CHECK(h.lost_at(47s));
  }
  SECTION("a failover: later asynchronous beats there are confirmed as usual") {
    h.beat(20s, where(2, 1));
    h.beat(21s, where(2, 1, 1000, 900));
    h.beat(22s, where(2, 1, 1100, 1100));
    CHECK_FALSE(h.lost_at(47s));
    CHECK(h.lost_at(48s));  // counted from 21 s, which 22 s confirmed
  }
  SECTION("a failover: the row is gone on the new server, so the lease is lost at once") {
    h.beat(20s, where(2, 1), pgmutex::fail(Errc::lock_not_held, "no row"));
    CHECK_FALSE(h.book.holds(at(20s)));
    CHECK(h.book.lost_reason() == Errc::lease_lost);
  }
}

// wal_writer_delay = 10 s (or a WAL writer that cannot keep up): the server
// acknowledges every beat, but flushes none of them for a long while. Time
// passing proves nothing: the lease counts from the acquire until the
// server shows a beat flushed.
TEST_CASE("an asynchronous heartbeat counts once the server shows it flushed, never because time passed",
          "[grant_book][async]") {
  Holder h;
  for (int s = 1; s <= 26; ++s) {
    const auto when = std::chrono::milliseconds(s * 1000);
    h.beat(when, where(1, 0, 1000 + s, 500));  // acknowledged, nothing flushed past 500
  }
  CHECK_FALSE(h.lost_at(26s));
  CHECK(h.lost_at(27s));  // the acquire's lease: no beat is known durable
  CHECK_THAT(h.book.lost_reason().detail, Catch::Contains("not yet known to be durable"));

  SECTION("once a later answer shows the flush, the lease counts from the newest flushed beat") {
    Holder k;
    k.beat(1s, where(1, 0, 1001, 500));
    k.beat(2s, where(1, 0, 1002, 500));  // witness of 1 s: 1002
    k.beat(3s, where(1, 0, 1003, 1002));  // 1 s is flushed (1002); 2 s's witness 1003 is not
    CHECK_FALSE(k.lost_at(27s));
    CHECK(k.lost_at(28s));
  }
  SECTION("a beat sent before an earlier one was answered is no witness for it") {
    Holder k;
    // A manual beat answered at 5 s; another sent at 4 s (before that answer) reads wal 2000.
    (void)k.book.apply_beat(k.grant, at(1s), at(5s), ok, false, 1s, 100ms, where(1, 0, 1000, 0));
    (void)k.book.apply_beat(k.grant, at(4s), at(6s), ok, false, 1s, 100ms, where(1, 0, 2000, 2000));
    CHECK(k.lost_at(27s));  // neither is confirmed: 4 s was sent before 1 s's answer came
  }
  SECTION("a durable answer (synchronous commit, the first after a reconnect) counts at once, in any session") {
    Holder k;
    for (int s = 1; s <= 60; ++s)  // a server that closes idle sessions: every beat on a new one
      k.beat(std::chrono::milliseconds(s * 1000), where(static_cast<std::uint64_t>(s + 1), 0, 0, 0, /*durable=*/true));
    CHECK_FALSE(k.lost_at(86s));
    CHECK(k.lost_at(87s));
  }
}

// A paused process (SIGSTOP), or a timer thread that is not scheduled: the
// lease timer has not run, but every read compares the clock with the
// deadline, so nothing reads a stale "held".
TEST_CASE("every read of the grant compares the clock with the lease deadline", "[grant_book][pause]") {
  Book book{10s, /*asynchronous=*/false};
  const auto generation = book.begin(7, 99, at(0ms), at(1s), ServerSession{1, 0});
  const auto grant = *book.current(at(0ms));
  (void)book.apply_beat(grant, at(3s), at(3s), ok, true, 1s, 100ms, ServerSession{1, 0});
  // No on_timer() from here on: the timer is late.
  CHECK(book.holds(at(12999ms)));
  CHECK(book.holds(generation, at(12999ms)));
  CHECK_FALSE(book.lost(generation, at(12999ms)));
  CHECK_FALSE(book.holds(at(13s)));
  CHECK_FALSE(book.holds(generation, at(13s)));
  CHECK(book.lost(generation, at(13s)));
  CHECK_FALSE(book.current(at(13s)));

  SECTION("a late answer never brings the lease back, even a good one sent before the deadline") {
    auto applied = book.apply_beat(grant, at(12s), at(14s), ok, true, 1s, 100ms, ServerSession{1, 0});
    REQUIRE(applied.lost);
    CHECK(applied.lost->reason == Errc::lease_lost);
    CHECK_FALSE(book.holds(at(14s)));
    CHECK(book.lost(generation, at(14s)));
  }
  SECTION("expire() declares it once; the stop token handed out then is already stopped") {
    auto watched = book.stop_token(generation);  // taken while held: not stopped yet
    CHECK_FALSE(watched.stop_requested());
    auto notice = book.expire(at(13s));
    REQUIRE(notice);
    CHECK(notice->reason == Errc::lease_lost);
    REQUIRE(notice->stop);
    CHECK_FALSE(book.expire(at(14s)));  // once
    CHECK(book.stop_token(generation).stop_requested());  // the announcement is on its way
    notice->stop->request_stop();                          // ...and stops the one handed out before
    CHECK(watched.stop_requested());
    CHECK_FALSE(book.on_timer(at(14s)).lost);  // the timer, late, finds it declared
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

// An election's value (review finding 1): due again once a heartbeat is
// answered in a new server history, at every good answer until a
// re-announcement settles it; never for a grant that announced nothing, or
// whose term was vacated, or past the lease.
TEST_CASE("an announced value is due again in a new server history, until settled", "[grant_book][failover][election]") {
  Holder h;
  const auto beat = [&](std::chrono::milliseconds when, std::uint64_t history) {
    return h.book.apply_beat(h.grant, at(when), at(when), ok, false, 1s, 100ms, where(1, history, 0, 0, true)).reannounce;
  };
  CHECK_FALSE(beat(1s, 1));  // nothing announced: nothing due
  h.book.note_announced(h.grant.generation, "v1");
  CHECK_FALSE(beat(2s, 1));  // the same history
  CHECK_FALSE(h.book.reannouncement(h.grant.generation, at(2s)));
  CHECK(beat(3s, 2));  // a failover
  CHECK(beat(4s, 2));  // still due: not yet settled
  auto again = h.book.reannouncement(h.grant.generation, at(4s));
  REQUIRE(again);
  CHECK(again->value == "v1");
  CHECK(again->grant.fence == 7);
  CHECK_FALSE(h.book.reannouncement(h.grant.generation + 1, at(4s)));  // another grant's
  CHECK_FALSE(h.book.reannouncement(h.grant.generation, at(32s)));    // past the lease
  h.book.reannounce_settled(h.grant.generation);
  CHECK_FALSE(beat(5s, 2));
  CHECK(beat(6s, 3));
  h.book.note_announced(h.grant.generation, "v2");  // a proclaim landed meanwhile: it settles too
  CHECK_FALSE(beat(7s, 3));
  h.book.note_vacated(h.grant.generation);
  CHECK_FALSE(beat(8s, 4));  // a vacated term is never announced again
  CHECK_FALSE(h.book.reannouncement(h.grant.generation, at(8s)));
}

// A provisional grant (AcquireResult::provisional_for): a queued waiter's
// confirm that committed without its WAL flush. A crash before the flush
// takes the grant back to the offer, which nobody else may take before the
// bound; so the lease ends there at the latest, the first heartbeat is due at
// once and commits synchronously, and only such a beat answered in the same
// server session (its flush passes the grant's) lifts the end.
TEST_CASE("a provisional grant ends at its bound unless a synchronous beat of the same session shows it durable",
          "[grant_book][provisional]") {
  const bool asynchronous = GENERATE(false, true);
  CAPTURE(asynchronous);
  Book book{27s, asynchronous};
  book.begin(7, 99, at(0ms), at(1s), ServerSession{1, 0}, 2s);
  const Book::Grant grant = *book.current(at(0ms));
  const auto due = book.on_timer(at(0ms));
  REQUIRE(due.beat);  // due at once
  CHECK(due.beat->durable);
  CHECK_FALSE(due.lost);
  const auto beat = [&](std::chrono::milliseconds sent, ServerSession where, const Result<void>& answer = ok) {
    return book.apply_beat(grant, at(sent), at(sent + 1ms), answer, true, 1s, 100ms, where);
  };
  const auto lost_at = [&](std::chrono::milliseconds when) {
    (void)book.on_timer(at(when));
    return !book.holds(at(when));
  };
  SECTION("no beat: lost at the bound, saying why") {
    CHECK_FALSE(lost_at(1999ms));
    CHECK(book.expire(at(2s)));
    CHECK(book.lost_reason() == Errc::lease_lost);
    CHECK_THAT(book.lost_reason().detail, Catch::Contains("not shown durable"));
  }
  SECTION("a synchronous beat of the same session: the whole lease, from its send") {
    const auto applied = beat(5ms, where(1, 0, 0, 0, /*durable=*/true));
    REQUIRE(applied.renewed);
    CHECK(*applied.renewed == at(5ms) + 27s);
    CHECK_FALSE(lost_at(27004ms));
    CHECK(lost_at(27005ms));
  }
  SECTION("a beat of another session (a reconnect: perhaps a crash took the grant back) lifts nothing") {
    (void)beat(5ms, where(2, 0, 0, 0, /*durable=*/true));
    CHECK_FALSE(lost_at(1999ms));
    CHECK(lost_at(2s));
  }
  SECTION("a transient failure is retried before the bound") {
    const auto applied = beat(5ms, where(1, 0), pgmutex::fail(Errc::backend_unavailable, "reset"));
    REQUIRE(applied.next_wakeup);
    CHECK(*applied.next_wakeup <= at(2s));
    CHECK_FALSE(lost_at(1999ms));
    CHECK(lost_at(2s));
  }
  SECTION("a row that is not ours any more: lost at once") {
    (void)beat(5ms, where(1, 0, 0, 0, true), pgmutex::fail(Errc::lock_not_held, "taken"));
    CHECK(lost_at(6ms));
  }
}

TEST_CASE("an asynchronous beat that was not durable does not lift a provisional grant's end", "[grant_book][provisional]") {
  Book book{27s, /*asynchronous=*/true};
  book.begin(7, 99, at(0ms), at(1s), ServerSession{1, 0}, 2s);
  const Book::Grant grant = *book.current(at(0ms));
  (void)book.apply_beat(grant, at(5ms), at(6ms), ok, false, 1s, 100ms, where(1, 0, 100, 100));
  CHECK(book.holds(at(1999ms)));
  CHECK_FALSE(book.holds(at(2s)));
}

TEST_CASE("a provisional bound longer than the lease is cut to the lease; a durable grant has none",
          "[grant_book][provisional]") {
  Book book{27s, /*asynchronous=*/false};
  book.begin(7, 99, at(0ms), at(1s), ServerSession{1, 0}, 60s);
  CHECK(book.holds(at(26999ms)));
  CHECK_FALSE(book.holds(at(27s)));
  book.begin(8, 100, at(30s), at(31s), ServerSession{1, 0});  // a durable grant: its beat is due at 31 s, as usual
  CHECK_FALSE(book.on_timer(at(30s)).beat);
  CHECK(book.holds(at(56999ms)));
}
