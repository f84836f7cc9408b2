// Elections (issue 18) on virtual time. The in-memory backend's rules, as
// the Postgres backend's election_sql.cpp (tests/integration/test_election.cpp):
// who leads, announce and proclaim keyed by the grant, a retry that changes
// nothing, vacate, the count across terms, a stale or taken-over term, the
// value's bound, and what a failover keeps. Then BasicElection on the
// simulation: campaign, term, leader(), proclaim, resign to the next in line,
// a partitioned leader that learns it lost before anyone else can lead.
#include <catch2/catch.hpp>

#include <optional>

#include "pgmutex/memory_backend.hpp"
#include "pgmutex/testing/manual_clock.hpp"
#include "pgmutex/testing/simulation.hpp"

using namespace pgmutex;
using namespace std::chrono_literals;

namespace {

struct World {
  testing::ManualClock clock;
  std::shared_ptr<MemoryServer> server = MemoryServer::create(clock);
  MemoryBackend b{server};
  World() { REQUIRE(b.create_schema("t")); }

  HolderKey hold(std::string_view instance, GrantToken token) {
    auto won = b.try_acquire(AcquireRequest{LockRef{"t", "leader"}, instance, 60s, token});
    REQUIRE(won);
    REQUIRE(won->acquired);
    return HolderKey{LockRef{"t", "leader"}, instance, won->fence, token};
  }
  LeaderRecord leader() { return b.leader(LockRef{"t", "leader"}, 60s).value(); }
};

}  // namespace

TEST_CASE("MemoryBackend elections: announce, proclaim, vacate, keyed by the grant and counted", "[memory][election]") {
  World w;
  CHECK_FALSE(w.leader().leading());
  CHECK(w.leader().change == 0);

  const HolderKey a = w.hold("a", 11);
  auto elected = w.b.announce(a, "addr-1");
  REQUIRE(elected);
  CHECK(elected->term == a.fence);
  CHECK(elected->change == 1);
  CHECK(elected->leading());
  CHECK(w.leader().leading());
  CHECK(w.leader().value == "addr-1");
  CHECK(w.leader().instance_id == "a");

  w.clock.advance(5s);
  auto proclaimed = w.b.announce(a, "addr-2");
  REQUIRE(proclaimed);
  CHECK(proclaimed->change == 2);
  CHECK(proclaimed->term == a.fence);
  CHECK(proclaimed->since_us == elected->since_us);  // the term's start, not the proclaim's
  CHECK(w.b.announce(a, "addr-2")->change == 2);     // a retry changes nothing

  HolderKey stranger = a;
  stranger.token = 12;
  CHECK(w.b.announce(stranger, "evil").error() == Errc::lock_not_held);
  CHECK(w.b.vacate(stranger).error() == Errc::lock_not_held);
  CHECK(w.leader().value == "addr-2");

  auto vacated = w.b.vacate(a);
  REQUIRE(vacated);
  CHECK(vacated->change == 3);
  CHECK_FALSE(vacated->leading());
  CHECK(w.b.vacate(a)->change == 3);  // a retry: done already
  CHECK(w.b.announce(a, "addr-3").error() == Errc::lock_not_held);  // a vacated term is over
  REQUIRE(w.b.release(a));

  const HolderKey b = w.hold("b", 21);
  auto next = w.b.announce(b, "addr-b");
  REQUIRE(next);
  CHECK(next->term > a.fence);
  CHECK(next->change == 4);
  CHECK(next->since_us > elected->since_us);
}

TEST_CASE("MemoryBackend elections: a stale or taken-over term leads no more", "[memory][election]") {
  World w;
  const HolderKey a = w.hold("a", 31);
  REQUIRE(w.b.announce(a, "x"));
  w.clock.advance(61s);  // past the holder's 60 s
  CHECK(w.b.announce(a, "x2").error() == Errc::lock_not_held);  // its lease ran out: nothing announced
  CHECK(w.leader().value == "x");
  CHECK(w.leader().announced);
  CHECK_FALSE(w.leader().lock_live);
  CHECK_FALSE(w.leader().leading());
  const HolderKey b = w.hold("b", 32);  // takes the stale lock over
  CHECK(w.leader().lock_fence == b.fence);
  CHECK(w.leader().term == a.fence);
  CHECK_FALSE(w.leader().leading());
  CHECK(w.b.announce(a, "y").error() == Errc::lock_not_held);
  CHECK(w.b.vacate(a).error() == Errc::lock_not_held);
}

// Review finding 9: a refused announce or vacate says which of three things
// happened, in term_refused's words, which the Postgres backend uses too
// (tests/integration/test_election.cpp).
TEST_CASE("MemoryBackend elections: a refusal says why: the grant ended, the term was vacated, a higher term recorded",
          "[memory][election]") {
  World w;
  const HolderKey a = w.hold("a", 41);
  const std::string fence = std::to_string(a.fence);
  REQUIRE(w.b.announce(a, "x"));

  HolderKey stranger = a;
  stranger.token = 42;
  CHECK(w.b.announce(stranger, "evil").error().detail ==
        "lock 'leader': cannot announce: instance 'a' no longer holds the lock under fence " + fence +
            " (its grant ended: released, taken over, or past its lease)");
  CHECK(w.b.vacate(stranger).error().detail == "lock 'leader': cannot vacate: instance 'a' no longer holds the lock "
                                               "under fence " + fence + " (its grant ended: released or taken over)");

  REQUIRE(w.b.vacate(a));
  auto late = w.b.announce(a, "y");
  CHECK(late.error() == Errc::lock_not_held);
  CHECK(late.error().detail == "lock 'leader': cannot announce: term " + fence + " was vacated (a resign is under way)");

  // Past its lease the key holds nothing, though its row is still there.
  REQUIRE(w.b.release(a));
  const HolderKey b = w.hold("b", 43);
  w.clock.advance(61s);
  CHECK(w.b.announce(b, "z").error().detail ==
        "lock 'leader': cannot announce: instance 'b' no longer holds the lock under fence " + std::to_string(b.fence) +
            " (its grant ended: released, taken over, or past its lease)");

  // A record above the grant's fence: only a fence sequence reset makes one
  // (on Postgres); the text names both numbers and the repair.
  LeaderRecord above;
  above.term = a.fence + 100;
  const Result<LeaderRecord> higher = term_refused(a, "announce", true, above);
  CHECK(higher.error() == Errc::lock_not_held);
  CHECK(higher.error().detail.starts_with("lock 'leader': cannot announce: the election table records term " +
                                          std::to_string(a.fence + 100) + " above this grant's fence " + fence +
                                          " (the fence sequence was reset"));
  CHECK(higher.error().detail.find("run create_schema()") != std::string::npos);
}

TEST_CASE("MemoryBackend elections: the value's bound, and a failover keeps what was replicated", "[memory][election]") {
  World w;
  const HolderKey a = w.hold("a", 41);
  const std::string largest(max_election_value_bytes, 'v');
  REQUIRE(w.b.announce(a, largest));
  auto oversized = w.b.announce(a, largest + "v");
  REQUIRE_FALSE(oversized);
  CHECK(oversized.error() == Errc::invalid_argument);
  CHECK_THAT(oversized.error().message(),
             Catch::Contains("'leader'") && Catch::Contains("7169 bytes; at most 7168") && Catch::Contains("NOTIFY"));
  CHECK(w.b.announce(a, std::string("a\0b", 3)).error() == Errc::invalid_argument);
  CHECK(w.b.announce(a, "\xff").error() == Errc::invalid_argument);
  CHECK(w.leader().value == largest);

  w.server->replicate();
  REQUIRE(w.b.announce(a, "after"));
  w.server->fail_over();  // the standby had the first value
  auto broken = w.b.leader(LockRef{"t", "leader"}, 60s);  // the next statement finds the connection broken
  REQUIRE_FALSE(broken);
  CHECK(broken.error() == Errc::backend_unavailable);
  CHECK(w.leader().value == largest);
  CHECK(w.leader().change == 1);
}

namespace {

Options candidate(std::string instance) {
  return Options{.lock_name = "primary", .instance_id = std::move(instance)};
}

// A blocking campaign running as a spawned thread of the ManualExecutor.
struct Campaign {
  std::optional<Result<testing::SimElection::leadership_type>> got;
  testing::ManualClock::time_point at{};  // when it returned
};
void campaign_in(testing::Simulation& sim, testing::SimElection& e, Campaign& out, std::string value,
                 std::chrono::nanoseconds timeout) {
  sim.executor().spawn([&sim, &e, &out, value, timeout] {
    out.got = e.campaign(nothrow, value, timeout);
    out.at = sim.now();
  });
  sim.executor().run_due();
}

}  // namespace

TEST_CASE("BasicElection: campaign, term, leader(), proclaim, resign to the next in line", "[election][api]") {
  testing::Simulation sim;
  auto a = sim.election(candidate("a"));
  auto b = sim.election(candidate("b"));
  auto reader = sim.election(candidate("reader"));
  a.create_schema();
  CHECK_FALSE(reader.leader());  // nobody yet

  auto lead = a.campaign("10.0.0.1:80", 1s);
  REQUIRE(lead);
  CHECK(lead.value() == "10.0.0.1:80");
  auto now = reader.leader();
  REQUIRE(now);
  CHECK(now->term == lead.term());
  CHECK(now->value == "10.0.0.1:80");
  CHECK(now->instance_id == "a");

  lead.proclaim("10.0.0.1:81");
  CHECK(lead.value() == "10.0.0.1:81");
  CHECK(reader.leader()->value == "10.0.0.1:81");
  CHECK(reader.leader()->term == lead.term());

  // b waits in line; a resigns; b leads with a higher term.
  Campaign cb;
  campaign_in(sim, b, cb, "10.0.0.2:80", 60s);
  CHECK_FALSE(cb.got);
  // b.leader() while b waits in line (on Postgres that wait holds b's
  // connection: integration_election's "[reader]" case shows it reads on
  // another).
  auto seen_by_b = b.leader(nothrow);
  REQUIRE(seen_by_b);
  REQUIRE(*seen_by_b);
  CHECK((*seen_by_b)->instance_id == "a");
  // So does the leader's own: a read never waits behind its heartbeats.
  CHECK(lead.term() == a.leader()->term);
  const Fence first_term = lead.term();
  auto observer = sim.connection("observer");
  const auto before = observer.leader(LockRef{"mutex_lock", "primary"}, 600s).value();
  lead.resign();
  CHECK_FALSE(lead);
  const auto vacated = observer.leader(LockRef{"mutex_lock", "primary"}, 600s).value();
  CHECK_FALSE(vacated.announced);  // vacated, not just released
  CHECK(vacated.change == before.change + 1);
  sim.advance(1s);
  REQUIRE(cb.got);
  REQUIRE(*cb.got);
  REQUIRE(**cb.got);
  CHECK((*cb.got)->term() > first_term);
  CHECK(reader.leader()->instance_id == "b");
  CHECK(reader.leader()->value == "10.0.0.2:80");

  // The destructor resigns: nobody leads afterwards.
  cb.got.reset();
  CHECK_FALSE(reader.leader());
}

TEST_CASE("BasicElection: a value over the bound is refused before waiting; a timeout is an empty leadership",
          "[election][api]") {
  testing::Simulation sim;
  auto a = sim.election(candidate("a"));
  auto b = sim.election(candidate("b"));
  a.create_schema();
  const auto before = sim.server().operations();
  auto oversized = b.campaign(nothrow, std::string(max_election_value_bytes + 1, 'x'));
  REQUIRE_FALSE(oversized);
  CHECK(oversized.error() == Errc::invalid_argument);
  CHECK(sim.server().operations() == before);  // no statement

  auto lead = a.campaign("a", 1s);
  REQUIRE(lead);
  Campaign cb;
  campaign_in(sim, b, cb, "b", 2s);
  sim.advance(3s);
  REQUIRE(cb.got);
  REQUIRE(*cb.got);
  CHECK_FALSE(**cb.got);
  CHECK((*cb.got)->why() == Errc::timeout);
  CHECK(lead);
  CHECK(sim.server().peek_queue(LockRef{"mutex_lock", "primary"}).empty());  // it left the line
}

TEST_CASE("BasicElection: a partitioned leader learns it lost before anyone else can lead; its proclaim is refused",
          "[election][api]") {
  testing::Simulation sim;
  auto a = sim.election(candidate("a"));
  auto b = sim.election(candidate("b"));
  a.create_schema();
  auto lead = a.campaign("a", 1s);
  REQUIRE(lead);
  sim.server().partition("a");
  std::optional<testing::ManualClock::time_point> lost_at;
  std::stop_callback on_loss(lead.stop_token(), [&] { lost_at = sim.now(); });
  Campaign cb;
  campaign_in(sim, b, cb, "b", 3600s);
  sim.advance(700s);  // past a's stale threshold (600 s)
  REQUIRE(lost_at);
  REQUIRE(cb.got);
  REQUIRE(*cb.got);
  REQUIRE(**cb.got);
  CHECK(*lost_at < cb.at);  // a knew before b led
  CHECK(lead.lost());
  CHECK_FALSE(lead);
  auto late = lead.proclaim(nothrow, "still me?");
  REQUIRE_FALSE(late);
  CHECK(late.error() == Errc::lock_not_held);
  CHECK(lead.value() == "a");
  auto now = b.leader();
  REQUIRE(now);
  CHECK(now->instance_id == "b");
  CHECK(now->term > lead.term());
}

TEST_CASE("BasicElection: a leader paused past its lease cannot proclaim, even while its row is still there",
          "[election][api]") {
  testing::Simulation sim;
  auto a = sim.election(candidate("a"));
  a.create_schema();
  auto lead = a.campaign("a", 1s);
  REQUIRE(lead);
  sim.pause("a");  // SIGSTOP: no heartbeat, no watchdog
  sim.advance(700s);  // past the lease; nobody else campaigned, so the row is still a's
  sim.resume("a");
  // Its held-back timers run now, late, as a resumed process's would (and
  // free what they hold of the election's state).
  sim.executor().run_due();
  auto observer = sim.connection("observer");
  const auto before = observer.leader(LockRef{"mutex_lock", "primary"}, 600s).value();
  CHECK(before.term == lead.term());
  auto late = lead.proclaim(nothrow, "after the pause");
  REQUIRE_FALSE(late);
  CHECK(late.error() == Errc::lock_not_held);
  CHECK(observer.leader(LockRef{"mutex_lock", "primary"}, 600s).value().change == before.change);  // nothing sent
  CHECK(lead.lost());
  // Resigning still vacates the term (its row is still there): observers hear nobody leads.
  (void)lead.resign(nothrow);
  const auto after = observer.leader(LockRef{"mutex_lock", "primary"}, 600s).value();
  CHECK_FALSE(after.announced);
  CHECK(after.change == before.change + 1);
}

// Review finding 9: a backend's refusal already names the lock; the mutex's
// statements add the name only to a text that lacks it.
TEST_CASE("BasicElection: a refused proclaim names the lock once", "[election][api]") {
  testing::Simulation sim;
  auto a = sim.election(candidate("a"));
  a.create_schema();
  auto lead = a.campaign("a", 1s);
  REQUIRE(lead);
  REQUIRE(sim.connection("admin").force_release(LockRef{"mutex_lock", "primary"}));  // behind the leader's back
  auto late = lead.proclaim(nothrow, "after the force");
  REQUIRE_FALSE(late);
  CHECK(late.error() == Errc::lock_not_held);
  CHECK(late.error().detail == "lock 'primary': cannot announce: instance 'a' no longer holds the lock under fence " +
                                   std::to_string(lead.term()) +
                                   " (its grant ended: released, taken over, or past its lease)");
}

// Review finding 1: a proclaim commits in a transaction of its own, so a
// promoted standby (asynchronous replication) may have the grant without the
// last proclaim. (A campaign's grant and its announcement are one statement,
// BackendElectsInOneStatement: a failover keeps both or neither.) The leader
// keeps leading (its heartbeats match its row there), so it announces its
// value again once a heartbeat is answered in the new server history:
// leader() reports it, and an observer that saw the rollback is told.
TEST_CASE("BasicElection: a failover that kept the grant but lost the last proclaim: the leader announces again",
          "[election][api][failover]") {
  testing::Simulation sim;
  Options quick = candidate("a");
  quick.heartbeat_interval = 1s;
  quick.alert_threshold = 5s;
  quick.stale_threshold = 10s;
  quick.poll_interval = 100ms;
  auto a = sim.election(quick);
  a.create_schema();
  Options reader = quick;
  reader.instance_id = "watcher";
  auto obs = sim.observer(reader);
  REQUIRE(obs.next(1s));  // nobody leads yet

  auto lead = a.campaign("10.0.0.1:80", 1s);
  REQUIRE(lead);
  REQUIRE(obs.next(1s));  // elected
  sim.server().replicate();  // the grant and the first value
  const std::string value = "10.0.0.1:81";
  lead.proclaim(value);
  const Fence term = lead.term();
  auto seen = obs.next(1s);
  REQUIRE(seen);
  REQUIRE(seen->leader);
  CHECK(seen->leader->value == value);

  sim.pause("a");  // a's timers wait while the observer reads the new primary
  sim.server().fail_over();
  auto raw = sim.connection("raw");
  CHECK_FALSE(raw.leader(LockRef{"mutex_lock", "primary"}, 600s));  // the connection the failover broke
  const LeaderRecord promoted = raw.leader(LockRef{"mutex_lock", "primary"}, 600s).value();
  CHECK(promoted.lock_fence == term);  // the grant is there
  CHECK(promoted.value == "10.0.0.1:80");  // the proclaim is not
  auto rolled_back = obs.next(1s);
  REQUIRE(rolled_back);
  CHECK(rolled_back->gap);  // another history: the present, with the old value

  sim.resume("a");
  sim.advance(2s);  // the next heartbeat is answered in the new history: a announces again
  CHECK_FALSE(lead.lost());
  auto now = a.leader();
  REQUIRE(now);
  CHECK(now->term == term);
  CHECK(now->value == value);
  CHECK(now->instance_id == "a");
  auto told = obs.next(1s);
  REQUIRE(told);
  CHECK(told->event == LeaderEvent::proclaimed);
  CHECK(told->term == term);
  REQUIRE(told->leader);
  CHECK(told->leader->value == value);

  // Once is enough: later heartbeats announce nothing more.
  const auto change = raw.leader(LockRef{"mutex_lock", "primary"}, 600s).value().change;
  sim.advance(5s);
  CHECK(raw.leader(LockRef{"mutex_lock", "primary"}, 600s).value().change == change);
  lead.resign();
  CHECK_FALSE(a.leader());
}

TEST_CASE("MemoryBackend elections: a campaign's try announces the grant it makes; a resign's release vacates",
          "[memory][election]") {
  World w;
  const LockRef lock{"t", "leader"};
  GrantAnnouncement ann{"addr-a"};
  auto won = w.b.try_acquire(AcquireRequest{lock, "a", 60s, 11}, ann);
  REQUIRE(won);
  REQUIRE(won->acquired);
  CHECK(ann.announced);
  CHECK(w.leader().leading());
  CHECK(w.leader().term == won->fence);
  CHECK(w.leader().value == "addr-a");
  CHECK(w.leader().change == 1);

  GrantAnnouncement other{"addr-b"};
  auto refused = w.b.try_acquire(AcquireRequest{lock, "b", 60s, 12}, other);
  REQUIRE(refused);
  CHECK_FALSE(refused->acquired);
  CHECK_FALSE(other.announced);
  CHECK(w.leader().change == 1);  // a try that grants nothing announces nothing
  GrantAnnouncement bad{"\xff"};
  CHECK(w.b.try_acquire(AcquireRequest{lock, "b", 60s, 13}, bad).error() == Errc::invalid_argument);

  const HolderKey a{lock, "a", won->fence, 11};
  CHECK(w.b.release_vacating(HolderKey{lock, "a", won->fence, 99}).error() == Errc::lock_not_held);
  CHECK(w.leader().leading());  // another grant's key changes nothing
  REQUIRE(w.b.release_vacating(a));
  CHECK_FALSE(w.leader().announced);
  CHECK(w.leader().change == 2);
  CHECK(w.leader().lock_fence == 0);  // released too
  CHECK(w.b.release_vacating(a).error() == Errc::lock_not_held);
  CHECK(w.leader().change == 2);
}

TEST_CASE("MemoryBackend elections: a queued campaign's confirm announces; tried again after a lost reply, once",
          "[memory][election]") {
  World w;
  const LockRef lock{"t", "leader"};
  GrantAnnouncement first{"addr-a"};
  auto won = w.b.try_acquire(AcquireRequest{lock, "a", 60s, 21}, first);
  REQUIRE(won);
  REQUIRE(won->acquired);
  AcquireRequest b{lock, "b", 60s, 22};
  auto place = w.b.enqueue(b, 2s);
  REQUIRE(place);
  b.queue_ticket = place->ticket;
  REQUIRE(w.b.release_vacating(HolderKey{lock, "a", won->fence, 21}));  // vacated, offered to b
  CHECK(w.leader().change == 2);
  w.server->lose_replies(1);
  GrantAnnouncement ann{"addr-b"};
  auto lost = w.b.try_acquire(b, ann);
  REQUIRE_FALSE(lost);
  CHECK(lost.error() == Errc::outcome_unknown);
  auto again = w.b.try_acquire(b, ann);  // the confirm is idempotent, and so is its announcement
  REQUIRE(again);
  REQUIRE(again->acquired);
  CHECK(ann.announced);
  CHECK(w.leader().leading());
  CHECK(w.leader().value == "addr-b");
  CHECK(w.leader().term == again->fence);
  CHECK(w.leader().change == 3);  // announced once
}

TEST_CASE("BasicElection: one operation per transition: the grant announces, the resign's release vacates and hands on",
          "[election][api]") {
  testing::Simulation sim;
  auto a = sim.election(candidate("a"));
  auto b = sim.election(candidate("b"));
  a.create_schema();
  auto observer = sim.connection("observer");
  const LockRef lock{"mutex_lock", "primary"};
  const auto ops = [&] { return sim.server().operations(); };

  auto at = ops();
  auto lead = a.campaign("a-1", 1s);  // a free lock: one try, which grants and announces
  REQUIRE(lead);
  CHECK(ops() - at == 1);
  const auto elected = observer.leader(lock, 600s).value();
  CHECK(elected.leading());
  CHECK(elected.term == lead.term());
  CHECK(elected.value == "a-1");

  Campaign cb;
  campaign_in(sim, b, cb, "b-1", 60s);  // a try refused, a place in line
  CHECK_FALSE(cb.got);
  at = ops();
  lead.resign();
  CHECK(ops() - at == 1);  // one release: vacated and offered to b
  const auto vacated = observer.leader(lock, 600s).value();
  CHECK_FALSE(vacated.announced);
  CHECK(vacated.change == elected.change + 1);
  at = ops();
  sim.advance(1s);  // b's look finds its turn: one confirm, which announces
  REQUIRE(cb.got);
  REQUIRE(*cb.got);
  REQUIRE(**cb.got);
  CHECK(ops() - at == 1);
  const auto next = observer.leader(lock, 600s).value();
  CHECK(next.leading());
  CHECK(next.term == (*cb.got)->term());
  CHECK(next.value == "b-1");
  CHECK(next.change == vacated.change + 1);
}

TEST_CASE("BasicElection: a campaign whose granting reply was lost adopts the grant, announced once", "[election][api]") {
  testing::Simulation sim;
  auto a = sim.election(candidate("a"));
  a.create_schema();
  sim.server().lose_replies(1);
  auto lead = a.campaign("a-1", 1s);  // the grant is adopted by its token; one more statement finds it announced
  REQUIRE(lead);
  const auto now = sim.connection("observer").leader(LockRef{"mutex_lock", "primary"}, 600s).value();
  CHECK(now.leading());
  CHECK(now.term == lead.term());
  CHECK(now.value == "a-1");
  CHECK(now.change == 1);
}
