// Observers (issue 18). The cursor's rules on their own (what a reading or a
// notice makes of an observer's position: in order, duplicates dropped, gaps
// told with their count, another history told, a term never going back),
// then BasicObserver on the simulation: an instance that never campaigns
// sees the present, every change in order, a gap while it was cut off, and
// a leader's expiry that nobody announces.
#include <catch2/catch.hpp>

#include <optional>
#include <vector>

#include "pgmutex/detail/observer_cursor.hpp"
#include "pgmutex/testing/simulation.hpp"

using namespace pgmutex;
using namespace std::chrono_literals;

namespace {

LeaderRecord record(Fence term, std::int64_t change, bool announced, bool live = true) {
  LeaderRecord r;
  r.term = term;
  r.change = change;
  r.announced = announced;
  r.value = "v" + std::to_string(term);
  r.instance_id = "i";
  r.lock_fence = term;
  r.lock_live = live;
  return r;
}

ElectionNotice notice(char kind, std::int64_t change, Fence term, std::string value = "x") {
  ElectionNotice n;
  n.kind = kind;
  n.change = change;
  n.term = term;
  n.value = std::move(value);
  n.instance_id = "i";
  return n;
}

}  // namespace

TEST_CASE("ObserverCursor: the present first, then every change in order; duplicates dropped", "[observer]") {
  detail::ObserverCursor c;
  CHECK_FALSE(c.hear(notice('l', 1, 10)));  // nothing before the first reading
  auto first = c.look(record(0, 0, false));
  REQUIRE(first);
  CHECK(first->event == LeaderEvent::current);
  CHECK_FALSE(first->leader);  // nobody leads: said, not left out
  CHECK_FALSE(first->gap);

  auto elected = c.hear(notice('l', 1, 10, "a"));
  REQUIRE(elected);
  CHECK(elected->event == LeaderEvent::elected);
  REQUIRE(elected->leader);
  CHECK(elected->leader->value == "a");
  CHECK(elected->term == 10);
  CHECK_FALSE(elected->gap);
  CHECK_FALSE(c.hear(notice('l', 1, 10, "a")));  // the same notice again
  LeaderRecord same = record(10, 1, true);
  same.value = "a";
  CHECK_FALSE(c.look(same));  // a reading that says nothing new

  auto proclaimed = c.hear(notice('p', 2, 10, "b"));
  REQUIRE(proclaimed);
  CHECK(proclaimed->event == LeaderEvent::proclaimed);
  CHECK(proclaimed->leader->value == "b");

  auto vacated = c.hear(notice('v', 3, 10));
  REQUIRE(vacated);
  CHECK(vacated->event == LeaderEvent::vacated);
  CHECK_FALSE(vacated->leader);
  CHECK(vacated->term == 10);
  CHECK(c.last_change() == 3);
}

TEST_CASE("ObserverCursor: a jump in the count is a gap with the number missed", "[observer]") {
  detail::ObserverCursor c;
  REQUIRE(c.look(record(10, 1, true)));
  SECTION("by notice") {
    auto jumped = c.hear(notice('l', 5, 30));
    REQUIRE(jumped);
    CHECK(jumped->gap);
    CHECK(jumped->missed == 3);
    CHECK(jumped->event == LeaderEvent::elected);
  }
  SECTION("by reading") {
    auto jumped = c.look(record(30, 4, true));
    REQUIRE(jumped);
    CHECK(jumped->gap);
    CHECK(jumped->missed == 2);
    CHECK(jumped->event == LeaderEvent::elected);
    CHECK(jumped->leader->term == 30);
  }
  SECTION("a proclaim of a term whose election was missed begins it") {
    auto p = c.hear(notice('p', 3, 20));
    REQUIRE(p);
    CHECK(p->event == LeaderEvent::elected);
    CHECK(p->missed == 1);
  }
}

TEST_CASE("ObserverCursor: a lease that ran out unannounced is an expiry; a reading after it is not", "[observer]") {
  detail::ObserverCursor c;
  REQUIRE(c.look(record(10, 1, true)));
  auto expired = c.look(record(10, 1, true, /*live=*/false));
  REQUIRE(expired);
  CHECK(expired->event == LeaderEvent::expired);
  CHECK(expired->term == 10);
  CHECK_FALSE(expired->leader);
  CHECK_FALSE(expired->gap);
  CHECK_FALSE(c.look(record(10, 1, true, false)));  // told once
  // The successor's election, heard: in order after the expiry.
  auto next = c.hear(notice('l', 2, 11));
  REQUIRE(next);
  CHECK(next->event == LeaderEvent::elected);
  CHECK_FALSE(next->gap);
}

TEST_CASE("ObserverCursor: another history is a gap of unknown size; a term never goes back", "[observer]") {
  detail::ObserverCursor c;
  REQUIRE(c.look(record(10, 1, true)));
  REQUIRE(c.hear(notice('l', 2, 20)));
  SECTION("the count went back, the term did not: the present, with a gap") {
    auto after = c.look(record(25, 1, true));
    REQUIRE(after);
    CHECK(after->gap);
    CHECK_FALSE(after->missed);
    CHECK(after->term == 25);
  }
  SECTION("a rolled-back primary shows an older term: told nobody leads, once; never the older term") {
    auto after = c.look(record(10, 1, true));
    REQUIRE(after);
    CHECK(after->event == LeaderEvent::vacated);
    CHECK(after->term == 20);
    CHECK(after->gap);
    CHECK_FALSE(after->leader);
    CHECK_FALSE(c.hear(notice('p', 2, 10)));  // the old term's proclaim: never
    CHECK_FALSE(c.look(record(10, 2, true)));
    auto higher = c.hear(notice('l', 3, 21));  // a term above all seen: reported
    REQUIRE(higher);
    CHECK(higher->term == 21);
  }
}

// Found by the async failover test (test_failover.cpp): the new primary
// lacked the vanished leader's election, and the rival's election there was
// its first change, as the vanished one had been on the old primary. An
// observer that read it took the count for one it had seen, and went on
// reporting the vanished leader while the rival led.
TEST_CASE("ObserverCursor: the count reached again with another term or value is another history", "[observer]") {
  detail::ObserverCursor c;
  REQUIRE(c.look(record(10, 1, true)));
  SECTION("another term: a rival elected on the new primary") {
    auto after = c.look(record(20, 1, true));
    REQUIRE(after);
    CHECK(after->event == LeaderEvent::current);
    CHECK(after->gap);
    CHECK_FALSE(after->missed);
    REQUIRE(after->leader);
    CHECK(after->leader->term == 20);
    CHECK_FALSE(c.look(record(20, 1, true)));  // told once
    auto next = c.hear(notice('p', 2, 20, "v20'"));
    REQUIRE(next);
    CHECK(next->event == LeaderEvent::proclaimed);
    CHECK_FALSE(next->gap);
  }
  SECTION("the same term, another value: the new primary lacks a proclaim and has had another") {
    LeaderRecord other = record(10, 1, true);
    other.value = "other";
    auto after = c.look(other);
    REQUIRE(after);
    CHECK(after->gap);
    REQUIRE(after->leader);
    CHECK(after->leader->value == "other");
  }
  SECTION("a lower term: nobody leads, and the lower term is never reported") {
    REQUIRE(c.hear(notice('l', 2, 30, "v30")));
    auto after = c.look(record(20, 2, true));
    REQUIRE(after);
    CHECK(after->event == LeaderEvent::vacated);
    CHECK(after->gap);
    CHECK_FALSE(after->leader);
  }
  SECTION("a notice counts its term and value: a reading of the same change is nothing new") {
    REQUIRE(c.hear(notice('p', 2, 10, "v10'")));
    LeaderRecord same = record(10, 2, true);
    same.value = "v10'";
    CHECK_FALSE(c.look(same));
  }
}

namespace {

Options member(std::string instance) {
  return Options{.lock_name = "primary", .instance_id = std::move(instance), .poll_interval = 100ms};
}

// Takes every change the observer has within `within` of virtual time.
std::vector<LeaderChange> drain(testing::SimObserver& o, std::chrono::nanoseconds within = 300ms) {
  std::vector<LeaderChange> out;
  while (auto c = o.next(within)) out.push_back(std::move(*c));
  return out;
}

}  // namespace

TEST_CASE("BasicObserver: an instance that never campaigns sees the present, then each change in order",
          "[observer][election]") {
  testing::Simulation sim;
  auto a = sim.election(member("a"));
  auto b = sim.election(member("b"));
  a.create_schema();
  auto obs = sim.observer(member("watcher"));

  auto first = obs.next(1s);
  REQUIRE(first);
  CHECK(first->event == LeaderEvent::current);
  CHECK_FALSE(first->leader);

  auto lead = a.campaign("10.0.0.1:80", 1s);
  REQUIRE(lead);
  auto elected = obs.next(1s);
  REQUIRE(elected);
  CHECK(elected->event == LeaderEvent::elected);
  CHECK(elected->term == lead.term());
  CHECK(elected->leader->value == "10.0.0.1:80");
  CHECK_FALSE(elected->gap);

  lead.proclaim("10.0.0.1:81");
  auto proclaimed = obs.next(1s);
  REQUIRE(proclaimed);
  CHECK(proclaimed->event == LeaderEvent::proclaimed);
  CHECK(proclaimed->leader->value == "10.0.0.1:81");

  lead.resign();
  auto vacated = obs.next(1s);
  REQUIRE(vacated);
  CHECK(vacated->event == LeaderEvent::vacated);
  CHECK(vacated->term == proclaimed->term);

  auto next = b.campaign("10.0.0.2:80", 1s);
  REQUIRE(next);
  auto second = obs.next(1s);
  REQUIRE(second);
  CHECK(second->event == LeaderEvent::elected);
  CHECK(second->term > vacated->term);
  CHECK(second->leader->instance_id == "b");
  CHECK_FALSE(obs.next(1s));  // nothing more: the timeout
}

TEST_CASE("BasicObserver: changes it could not see come as one report with the number missed",
          "[observer][election]") {
  testing::Simulation sim;
  auto a = sim.election(member("a"));
  a.create_schema();
  auto obs = sim.observer(member("watcher"));
  REQUIRE(obs.next(1s));  // nobody

  sim.server().partition("watcher");
  auto lead = a.campaign("one", 1s);
  REQUIRE(lead);
  auto cut = obs.next(nothrow, 200ms);
  REQUIRE_FALSE(cut);  // the server unreachable: an error, nothing lost
  lead.proclaim("two");
  lead.proclaim("three");
  sim.server().heal("watcher");

  auto changes = drain(obs);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].event == LeaderEvent::elected);
  CHECK(changes[0].gap);
  CHECK(changes[0].missed == 2);
  CHECK(changes[0].leader->value == "three");
}

TEST_CASE("BasicObserver: a leader that stops heartbeating is reported expired at its stale deadline",
          "[observer][election]") {
  testing::Simulation sim;
  Options short_lease = member("a");
  short_lease.heartbeat_interval = 3s;
  short_lease.alert_threshold = 10s;
  short_lease.stale_threshold = 30s;
  auto a = sim.election(short_lease);
  a.create_schema();
  Options reader = member("watcher");
  reader.heartbeat_interval = 3s;
  reader.alert_threshold = 10s;
  reader.stale_threshold = 30s;
  auto obs = sim.observer(reader);
  auto lead = a.campaign("a", 1s);
  REQUIRE(lead);
  auto now = obs.next(1s);
  REQUIRE(now);
  REQUIRE(now->leader);

  CHECK_FALSE(obs.next(20s));  // heartbeats go on: nothing to report
  sim.server().partition("a");  // its heartbeats stop reaching the server
  const auto cut_at = sim.now();
  auto expired = obs.next(60s);
  REQUIRE(expired);
  CHECK(expired->event == LeaderEvent::expired);
  CHECK(expired->term == lead.term());
  CHECK_FALSE(expired->leader);
  CHECK(sim.now() - cut_at <= 31s);  // by the stale deadline (plus a poll), not later
}

TEST_CASE("BasicObserver::observe waits out an unreachable server, and ends on a missing table",
          "[observer][election]") {
  testing::Simulation sim;
  auto a = sim.election(member("a"));
  a.create_schema();
  auto obs = sim.observer(member("watcher"));
  auto lead = a.campaign("one", 1s);
  REQUIRE(lead);

  sim.server().partition("watcher");
  sim.executor().schedule_after(1s, [&] { sim.server().heal("watcher"); });
  sim.executor().schedule_after(2s, [&] { lead.proclaim("two"); });
  std::stop_source stop;
  std::vector<LeaderChange> seen;
  auto ended = obs.observe(nothrow, [&](const LeaderChange& c) {
    seen.push_back(c);
    if (seen.size() == 2) stop.request_stop();
  }, stop.get_token());
  REQUIRE(ended);  // the partition was waited out, not returned
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].event == LeaderEvent::current);
  CHECK(seen[0].leader->value == "one");
  CHECK(seen[1].event == LeaderEvent::proclaimed);
  CHECK(seen[1].leader->value == "two");

  Options elsewhere = member("watcher-2");
  elsewhere.table = "never_made";
  auto lost = sim.observer(elsewhere);
  auto missing = lost.observe(nothrow, [](const LeaderChange&) {}, {});
  REQUIRE_FALSE(missing);
  CHECK(missing.error() == Errc::schema_missing);
}

TEST_CASE("BasicElection::observer: a candidate follows the election on a backend of its own", "[observer][election]") {
  testing::Simulation sim;
  auto a = sim.election(member("a"));
  auto b = sim.election(member("b"));
  a.create_schema();
  auto lead = a.campaign("a", 1s);
  REQUIRE(lead);
  auto follows = b.observer();
  auto now = follows.next(1s);
  REQUIRE(now);
  CHECK(now->event == LeaderEvent::current);
  REQUIRE(now->leader);
  CHECK(now->leader->instance_id == "a");
  CHECK(follows.name() == "primary");
  lead.resign();
  auto vacated = follows.next(1s);
  REQUIRE(vacated);
  CHECK(vacated->event == LeaderEvent::vacated);
}
