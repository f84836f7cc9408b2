// [faults][election]: elections under real faults (issue 18: "nobody acts
// as leader past its lease"), as test_faults.cpp and test_guarantee.cpp do
// for the mutex. Built into integration_faults, which runs alone (one case
// restarts the server).
//   [frozen]    the leader's connection freezes (tests/tools/fault_proxy.py):
//               its lease is lost on its own clock before the successor's
//               campaign returns; the successor's term is higher; an
//               observer sees the terms rise
//   [terminate] pg_terminate_backend on the leader's connection: it
//               reconnects and leads on, the same term; leader() says so;
//               a proclaim on the dead connection lands
//   [restart]   the server restarts under a leader and an observer: the
//               leadership is kept (its lease outlasts the restart), the
//               observer resumes and reports what it missed as a gap
// Leases are short (1.5 to 8 s); timings are never asserted, only orders.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <thread>
#include <vector>

#include "fault_proxy.hpp"
#include "support.hpp"

using namespace itest;
using pgmutex::Errc;
using pgmutex::LeaderChange;
using pgmutex::LeaderEvent;
using pgmutex::PostgresBackend;

namespace {

using steady = std::chrono::steady_clock;

// A lease of `stale - margin`, a beat every 200 ms; one attempt may take `attempt`.
pgmutex::Options quick(const std::string& table, const std::string& instance, std::chrono::milliseconds stale,
                       std::chrono::milliseconds margin, std::chrono::milliseconds attempt) {
  auto o = options(table, "primary", instance);
  o.heartbeat_interval = 200ms;
  o.alert_threshold = stale / 2;
  o.stale_threshold = stale;
  o.safety_margin = margin;
  o.heartbeat_timeout = attempt;
  return o;
}

pgmutex::PostgresOptions quick_reconnects() {
  pgmutex::PostgresOptions po;
  po.reconnect_attempts = 2;
  po.reconnect_backoff = 50ms;
  return po;
}

// The next change within 5 s, taking errors as a reconnect does (the
// observer's connection died: it reads again on a new one).
LeaderChange next_change(pgmutex::Observer& o) {
  for (int i = 0; i < 20; ++i) {
    auto c = o.next(pgmutex::nothrow, 5s);
    if (!c) {
      UNSCOPED_INFO("try " << i << ": " << c.error().message());
      std::this_thread::sleep_for(100ms);
      continue;
    }
    REQUIRE(*c);
    return **c;
  }
  FAIL("no change within 20 tries");
  return {};
}

// pg_terminate_backend(pid); returns once that session is gone (its
// client may have connected again meanwhile: heartbeats go on).
void terminate_session(int pid) {
  const std::string p = std::to_string(pid);
  admin("SELECT pg_terminate_backend(" + p + ")");
  REQUIRE(eventually([&] { return admin("SELECT count(*) FROM pg_stat_activity WHERE pid = " + p)[0][0].as<int>() == 0; }));
}

// Nanoseconds on the steady clock, for an atomic.
long long stamp() { return steady::now().time_since_epoch().count(); }

}  // namespace

TEST_CASE("a leader frozen behind a proxy: lost on its own clock before the successor's campaign returns, "
          "which gets a higher term",
          "[faults][election][frozen]") {
  const std::string table = fresh_table("election_frozen");
  // Lease 1.5 s; the row is stale for a successor after 3 s.
  const auto o = [&](const std::string& who) { return quick(table, who, 3s, 1500ms, 500ms); };
  FaultProxy proxy;
  pgmutex::Election a(PostgresBackend(proxy.dsn()), o("a"));
  a.create_schema();
  pgmutex::Election b(PostgresBackend(""), o("b"));
  pgmutex::Observer obs(PostgresBackend(""), o("watcher"));
  REQUIRE_FALSE(next_change(obs).leader);

  auto lead = a.campaign("a:1", 5s);
  REQUIRE(lead);
  const LeaderChange elected = next_change(obs);
  CHECK(elected.event == LeaderEvent::elected);
  CHECK(elected.term == lead.term());
  std::atomic<long long> lost_at{0};
  std::stop_callback on_lost(lead.stop_token(), [&] { lost_at = stamp(); });

  proxy.set("freeze");  // a's statements hang from now on; its clock goes on
  const long long frozen_at = stamp();
  auto next = b.campaign("b:1", 15s);  // waits in line until a's row is stale
  const long long won_at = stamp();
  REQUIRE(next);
  INFO("a lost its lease " << (lost_at - frozen_at) / 1'000'000 << " ms after the freeze; b led "
                           << (won_at - frozen_at) / 1'000'000 << " ms after it");
  REQUIRE(lost_at != 0);
  CHECK(lost_at < won_at);
  CHECK(lead.lost());
  CHECK_FALSE(lead);
  CHECK(next.term() > lead.term());
  auto late = lead.proclaim(pgmutex::nothrow, "a:2");  // refused on a's own clock, nothing sent
  REQUIRE_FALSE(late);
  CHECK(late.error() == Errc::lock_not_held);
  auto now = b.leader();
  REQUIRE(now);
  CHECK(now->instance_id == "b");
  CHECK(now->term == next.term());

  // The observer: a's term ended (expired, unless b's election came first),
  // then b's began; never a term below one it reported.
  pgmutex::Fence highest = elected.term;
  std::optional<LeaderChange> last;
  for (int i = 0; i < 3 && !(last && last->leader && last->leader->instance_id == "b"); ++i) {
    last = next_change(obs);
    CHECK(last->term >= highest);
    CHECK((last->event == LeaderEvent::expired || last->event == LeaderEvent::elected));
    highest = std::max(highest, last->term);
  }
  REQUIRE(last);
  REQUIRE(last->leader);
  CHECK(last->leader->instance_id == "b");
  CHECK(last->term == next.term());
  proxy.set("pass");
}

TEST_CASE("pg_terminate_backend on the leader's connection: it reconnects and leads on with the same term",
          "[faults][election][terminate]") {
  const std::string table = fresh_table("election_terminate");
  const std::string app = "leader_" + std::to_string(::getpid());
  // Lease 4 s, a beat every second (so that a proclaim right after a
  // termination usually meets the dead connection); an attempt (a reconnect
  // included) may take 1 s.
  const auto o = [&](const std::string& who) {
    auto slow = quick(table, who, 6s, 2s, 1s);
    slow.heartbeat_interval = 1s;
    return slow;
  };
  pgmutex::Election a(PostgresBackend("application_name=" + app, quick_reconnects()), o("a"));
  a.create_schema();
  pgmutex::Election reader(PostgresBackend(""), o("reader"));
  pgmutex::Observer obs(PostgresBackend(""), o("watcher"));
  REQUIRE_FALSE(next_change(obs).leader);
  auto lead = a.campaign("a:1", 5s);
  REQUIRE(lead);
  const pgmutex::Fence term = lead.term();
  const LeaderChange elected = next_change(obs);
  CHECK(elected.term == term);
  const auto before = sessions_of(app);
  REQUIRE(before.size() == 1);

  terminate_session(before[0]);
  // The next heartbeat finds the connection dead and lands on a new one.
  CHECK(eventually([&] {
    const auto after = sessions_of(app);
    return after.size() == 1 && after[0] != before[0];
  }));
  CHECK_FALSE(lead.lost());
  auto still = reader.leader();
  REQUIRE(still);
  CHECK(still->term == term);
  CHECK(still->instance_id == "a");
  CHECK(still->value == "a:1");
  auto own = a.leader();  // through the leader's own, new connection
  REQUIRE(own);
  CHECK(own->term == term);

  // A proclaim right after a termination: if it meets the dead connection,
  // it is retried on a new one (an announce is idempotent); it lands.
  terminate_session(sessions_of(app).at(0));
  lead.proclaim("a:2");
  CHECK(reader.leader()->value == "a:2");
  CHECK(reader.leader()->term == term);
  const LeaderChange proclaimed = next_change(obs);
  CHECK(proclaimed.event == LeaderEvent::proclaimed);
  CHECK(proclaimed.term == term);
  CHECK_FALSE(proclaimed.gap);
  CHECK(proclaimed.leader->value == "a:2");
  CHECK_FALSE(obs.next(500ms));  // nothing else: no expiry, no other term
  CHECK_FALSE(lead.lost());
}

TEST_CASE("Postgres restarted under a leader and an observer: the leadership is kept, the observer resumes and "
          "reports what it missed as a gap",
          "[faults][election][restart]") {
  const Server s = server();
  const std::string table = fresh_table("election_restart");
  // Lease 8 s: longer than the restart takes, so the leadership is kept.
  const auto o = [&](const std::string& who) { return quick(table, who, 10s, 2s, 1s); };
  pgmutex::Election a(PostgresBackend("", quick_reconnects()), o("a"));
  a.create_schema();
  pgmutex::Observer obs(PostgresBackend("", quick_reconnects()), o("watcher"));
  REQUIRE_FALSE(next_change(obs).leader);
  auto lead = a.campaign("a:1", 5s);
  REQUIRE(lead);
  const pgmutex::Fence term = lead.term();
  const LeaderChange elected = next_change(obs);
  CHECK(elected.event == LeaderEvent::elected);
  CHECK(elected.term == term);
  CHECK_FALSE(obs.next(200ms));  // listening, nothing to report

  const auto down = steady::now();
  REQUIRE(std::system((s.pgctl + " -m fast stop >/dev/null").c_str()) == 0);
  std::this_thread::sleep_for(1s);
  REQUIRE(std::system((s.pgctl + " start >/dev/null").c_str()) == 0);
  // The leader's heartbeats resume on a new connection; it still leads.
  std::optional<pgmutex::Leader> after;
  CHECK(eventually([&] {
    auto read = a.leader(pgmutex::nothrow);
    if (read && *read) after = **read;
    return after.has_value();
  }));
  INFO("the leader was read again " << std::chrono::duration<double>(steady::now() - down).count()
                                    << " s after the server went down");
  REQUIRE(after);
  CHECK(after->term == term);
  CHECK(after->instance_id == "a");
  CHECK_FALSE(lead.lost());

  // Two proclaims while the observer is not reading (its connection died
  // with the server): it reads again, and reports where things stand with
  // the one change it missed.
  lead.proclaim("a:2");
  lead.proclaim("a:3");
  const LeaderChange resumed = next_change(obs);
  CHECK(resumed.event == LeaderEvent::proclaimed);
  CHECK(resumed.term == term);
  CHECK(resumed.gap);
  CHECK(resumed.missed == 1);
  REQUIRE(resumed.leader);
  CHECK(resumed.leader->value == "a:3");
  lead.proclaim("a:4");
  const LeaderChange then = next_change(obs);
  CHECK(then.event == LeaderEvent::proclaimed);
  CHECK_FALSE(then.gap);
  CHECK(then.term == term);
  CHECK(then.leader->value == "a:4");
  CHECK_FALSE(lead.lost());
}
