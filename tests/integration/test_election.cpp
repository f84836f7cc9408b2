// [election][sql]: the election's statements on a real server (issue 18,
// phase 1: election_sql.cpp through PostgresBackend). Who leads, in one read;
// the holder's announce (elected, proclaimed, a retry changing nothing) and
// vacate, each keyed by its grant; a stale key refused with nothing changed;
// the table made next to a seed-made one; observers told on the lock's
// channel plus "_e"; the value's bound on both sides; a table not upgraded;
// the same through a Session. Then Election and SessionElection ([api]).
#include <pqxx/pqxx>

#include <algorithm>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "pgmutex/session.hpp"
#include "election_rules.hpp"  // the payload read back
#include "sql.hpp"  // the backend's own channel name, to LISTEN as an observer will
#include "support.hpp"

using namespace itest;
using pgmutex::AcquireRequest;
using pgmutex::Errc;
using pgmutex::Fence;
using pgmutex::HolderKey;
using pgmutex::LeaderRecord;
using pgmutex::LockRef;
using pgmutex::PostgresBackend;

namespace {

// create_schema, its error shown if it fails.
void make(PostgresBackend& backend, const std::string& table) {
  auto made = backend.create_schema(table);
  INFO((made ? std::string() : made.error().message()));
  REQUIRE(made);
}

// The holder's key after a won try (its views: the caller's table, and literals).
HolderKey hold(PostgresBackend& backend, const std::string& table, std::string_view lock, std::string_view who,
               pgmutex::GrantToken token) {
  AcquireRequest r{LockRef{table, lock}, who, 60s, token, 5s};
  auto won = backend.try_acquire(r);
  REQUIRE(won);
  REQUIRE(won->acquired);
  return HolderKey{LockRef{table, lock}, who, won->fence, token, 5s};
}

// Payloads on the election channel of one lock, as an observer hears them.
struct Told : pqxx::notification_receiver {
  Told(pqxx::connection_base& c, const std::string& channel) : pqxx::notification_receiver(c, channel) {}
  void operator()(const std::string& payload, int) override { payloads.push_back(payload); }
  std::vector<std::string> payloads;
};

std::string election_channel(const std::string& table, const std::string& lock) {
  const auto oid = admin("SELECT '" + table + "'::regclass::oid::bigint")[0][0].as<std::string>();
  return pgmutex::postgres_detail::release_channel(oid, lock) + "_e";
}

// Waits up to 5 s until `told` has heard `n` payloads.
void hear(pqxx::connection& c, Told& told, std::size_t n) {
  for (int i = 0; i < 50 && told.payloads.size() < n; ++i) c.await_notification(0, 100'000);
}

}  // namespace

TEST_CASE("the election table: made next to the lock table, again harmlessly, and next to a seed-made one",
          "[election][sql]") {
  PostgresBackend backend("");
  const std::string table = fresh_table("election_schema");
  make(backend, table);
  make(backend, table);
  CHECK(admin("SELECT to_regclass('" + table + "_election') IS NOT NULL")[0][0].as<bool>());

  const std::string seeded = seed_made_table("election_seed");
  make(backend, seeded);
  CHECK(admin("SELECT to_regclass('" + seeded + "_election') IS NOT NULL")[0][0].as<bool>());
  auto nobody = backend.leader(LockRef{seeded, "job"}, 60s);
  REQUIRE(nobody);
  CHECK(nobody->term == 0);
  CHECK_FALSE(nobody->leading());
}

TEST_CASE("announce, proclaim, vacate: keyed by the grant, counted, told to observers", "[election][sql]") {
  PostgresBackend backend("");
  const std::string table = fresh_table("election_cycle");
  make(backend, table);
  pqxx::connection listener("");
  Told told(listener, election_channel(table, "leader"));

  // Nobody leads yet.
  auto before = backend.leader(LockRef{table, "leader"}, 60s);
  REQUIRE(before);
  CHECK_FALSE(before->leading());
  CHECK(before->change == 0);

  const HolderKey a = hold(backend, table, "leader", "a", 11);
  auto elected = backend.announce(a, "10.0.0.1:80");
  REQUIRE(elected);
  CHECK(elected->term == a.fence);
  CHECK(elected->change == 1);
  CHECK(elected->leading());
  CHECK(elected->value == "10.0.0.1:80");
  CHECK(elected->instance_id == "a");
  CHECK_FALSE(elected->host.empty());

  auto read = backend.leader(LockRef{table, "leader"}, 60s);
  REQUIRE(read);
  CHECK(read->leading());
  CHECK(read->term == a.fence);
  CHECK(read->value == "10.0.0.1:80");
  CHECK(read->lock_fence == a.fence);

  // A proclaim keeps the term and its start; the same value again changes nothing.
  auto proclaimed = backend.announce(a, "10.0.0.1:81");
  REQUIRE(proclaimed);
  CHECK(proclaimed->term == a.fence);
  CHECK(proclaimed->change == 2);
  CHECK(proclaimed->since_us == elected->since_us);
  auto again = backend.announce(a, "10.0.0.1:81");
  REQUIRE(again);
  CHECK(again->change == 2);

  // A key that does not hold the lock (another token) is refused, nothing changed.
  HolderKey stranger = a;
  stranger.token = 12;
  auto refused = backend.announce(stranger, "evil");
  REQUIRE_FALSE(refused);
  CHECK(refused.error() == Errc::lock_not_held);
  // In term_refused's words, as MemoryBackend says it (tests/unit/test_election.cpp).
  CHECK(refused.error().detail == "lock 'leader': cannot announce: instance 'a' no longer holds the lock under fence " +
                                      std::to_string(a.fence) +
                                      " (its grant ended: released, taken over, or past its lease)");
  CHECK(backend.vacate(stranger).error().detail ==
        "lock 'leader': cannot vacate: instance 'a' no longer holds the lock under fence " + std::to_string(a.fence) +
            " (its grant ended: released or taken over)");
  CHECK(backend.leader(LockRef{table, "leader"}, 60s)->value == "10.0.0.1:81");

  // Resign: vacate, then release. A vacate tried again (a lost reply) is done already.
  auto vacated = backend.vacate(a);
  REQUIRE(vacated);
  CHECK(vacated->change == 3);
  CHECK_FALSE(vacated->leading());
  auto vacated_again = backend.vacate(a);
  REQUIRE(vacated_again);
  CHECK(vacated_again->change == 3);
  // A vacated term cannot be proclaimed again.
  auto late = backend.announce(a, "10.0.0.1:82");
  REQUIRE_FALSE(late);
  CHECK(late.error() == Errc::lock_not_held);
  CHECK(late.error().detail ==
        "lock 'leader': cannot announce: term " + std::to_string(a.fence) + " was vacated (a resign is under way)");
  REQUIRE(backend.release(a));

  // The successor's term is higher; the count goes on.
  const HolderKey b = hold(backend, table, "leader", "b", 21);
  auto next = backend.announce(b, "10.0.0.2:80");
  REQUIRE(next);
  CHECK(next->term > a.fence);
  CHECK(next->change == 4);

  hear(listener, told, 4);
  REQUIRE(told.payloads.size() == 4);  // the idempotent retry, the refusals and the second vacate told nothing
  // Each carries the whole change, so an observer needs no statement.
  const char kinds[] = {'l', 'p', 'v', 'l'};
  const Fence terms[] = {a.fence, a.fence, a.fence, b.fence};
  const std::string values[] = {"10.0.0.1:80", "10.0.0.1:81", "10.0.0.1:81", "10.0.0.2:80"};
  for (std::size_t i = 0; i < 4; ++i) {
    INFO(told.payloads[i]);
    auto n = pgmutex::postgres_detail::election_notice_of(told.payloads[i]);
    REQUIRE(n);
    CHECK(n->kind == kinds[i]);
    CHECK(n->change == static_cast<std::int64_t>(i + 1));
    CHECK(n->term == terms[i]);
    CHECK(n->value == values[i]);
    CHECK(n->instance_id == (i < 3 ? "a" : "b"));
    CHECK(n->since_us > 0);
  }
  CHECK_FALSE(pgmutex::postgres_detail::election_notice_of("o:1:2:3"));  // a queue's offer is none
}

// Review finding 8: the election table does not depend on the lock table,
// so dropping the lock table and its sequence and making them again would
// restart fences below the recorded terms. An announce then says so, naming
// both numbers; create_schema moves the sequence past the terms, and a
// campaign wins and is announced again.
TEST_CASE("a fence sequence reset under a surviving election table: named, and repaired by create_schema",
          "[election][sql]") {
  const std::string table = fresh_table("election_reset");
  {
    pgmutex::Election a(PostgresBackend(""), options(table, "primary", "a"));
    a.create_schema();
    auto lead = a.campaign("before", 5s);
    REQUIRE(lead);
    lead.resign();
  }
  const Fence recorded = admin("SELECT term FROM " + table + "_election")[0][0].as<Fence>();

  // A record above the grant's fence (as a reset leaves it): the announce names both numbers.
  PostgresBackend backend("");
  admin("UPDATE " + table + "_election SET term = term + 1000");
  const HolderKey low = hold(backend, table, "primary", "low", 51);
  auto refused = backend.announce(low, "v");
  REQUIRE_FALSE(refused);
  CHECK(refused.error() == Errc::lock_not_held);
  INFO(refused.error().detail);
  CHECK(refused.error().detail.starts_with("lock 'primary': cannot announce: the election table records term " +
                                           std::to_string(recorded + 1000) + " above this grant's fence " +
                                           std::to_string(low.fence) + " (the fence sequence was reset"));
  REQUIRE(backend.release(low));
  {
    // A campaign gets the same words, once prefixed, and leaves the lock to the next.
    pgmutex::Election b(PostgresBackend(""), options(table, "primary", "b"));
    auto lost = b.campaign(pgmutex::nothrow, "b", 5s);
    REQUIRE_FALSE(lost);
    INFO(lost.error().detail);
    CHECK(lost.error().detail.starts_with("lock 'primary': cannot announce: the election table records term " +
                                          std::to_string(recorded + 1000) + " above this grant's fence "));
    CHECK(admin("SELECT count(*) FROM " + table)[0][0].as<int>() == 0);
  }
  make(backend, table);  // moves the sequence past the terms
  const HolderKey next = hold(backend, table, "primary", "next", 52);
  CHECK(next.fence > recorded + 1000);
  auto elected = backend.announce(next, "after the repair");
  INFO((elected ? std::string() : elected.error().detail));
  REQUIRE(elected);
  CHECK(elected->term == next.fence);
  REQUIRE(backend.vacate(next));
  REQUIRE(backend.release(next));
  const Fence top = admin("SELECT term FROM " + table + "_election")[0][0].as<Fence>();

  // The reset itself: the lock table and its sequence dropped, the election
  // table kept; create_schema makes them again, past the terms.
  admin("DROP TABLE " + table);
  admin("DROP SEQUENCE " + table + "_fence_seq");
  {
    pgmutex::Election c(PostgresBackend(""), options(table, "primary", "c"));
    c.create_schema();
    auto lead = c.campaign("after the reset", 5s);
    REQUIRE(lead);
    CHECK(lead.term() > top);
    auto now = c.leader();
    REQUIRE(now);
    CHECK(now->term == lead.term());
    CHECK(now->value == "after the reset");
    lead.resign();
  }
  // A healthy schema is left as it is: create_schema again moves nothing.
  const auto sequence_now = [&] {
    return admin("SELECT last_value FROM " + table + "_fence_seq")[0][0].as<long long>();
  };
  const long long before = sequence_now();
  make(backend, table);
  CHECK(sequence_now() == before);
}

TEST_CASE("who leads: a term whose grant went stale or was taken over leads no more", "[election][sql]") {
  PostgresBackend backend("");
  const std::string table = fresh_table("election_stale");
  make(backend, table);
  const HolderKey a = hold(backend, table, "leader", "a", 31);
  REQUIRE(backend.announce(a, "x"));
  // The holder stopped beating an hour ago (its stored threshold is 60 s).
  admin("UPDATE " + table + " SET last_heartbeat = now() - interval '1 hour' WHERE lock_name = 'leader'");
  // Its lease ran out: it announces nothing more, even before anyone takes over.
  CHECK(backend.announce(a, "x2").error() == Errc::lock_not_held);
  CHECK(backend.leader(LockRef{table, "leader"}, 60s)->value == "x");
  auto stale = backend.leader(LockRef{table, "leader"}, 60s);
  REQUIRE(stale);
  CHECK(stale->announced);
  CHECK_FALSE(stale->lock_live);
  CHECK_FALSE(stale->leading());
  // A plain try takes the stale lock over: a new fence, not announced.
  const HolderKey b = hold(backend, table, "leader", "b", 32);
  auto taken = backend.leader(LockRef{table, "leader"}, 60s);
  REQUIRE(taken);
  CHECK(taken->lock_fence == b.fence);
  CHECK(taken->term == a.fence);
  CHECK_FALSE(taken->leading());
  // The old term can neither proclaim nor vacate.
  CHECK(backend.announce(a, "y").error() == Errc::lock_not_held);
  CHECK(backend.vacate(a).error() == Errc::lock_not_held);
}

TEST_CASE("a value's bound: refused before any statement, and by the table itself", "[election][sql]") {
  PostgresBackend backend("");
  const std::string table = fresh_table("election_value");
  make(backend, table);
  const HolderKey a = hold(backend, table, "leader", "a", 41);
  const std::string largest(pgmutex::max_election_value_bytes, 'v');
  auto fits = backend.announce(a, largest);
  REQUIRE(fits);
  CHECK(fits->value == largest);

  auto oversized = backend.announce(a, largest + "v");
  REQUIRE_FALSE(oversized);
  CHECK(oversized.error() == Errc::invalid_argument);
  CHECK_THAT(oversized.error().message(), Catch::Contains("7169 bytes; at most 7168") && Catch::Contains("NOTIFY"));
  CHECK(backend.announce(a, std::string("a\0b", 3)).error() == Errc::invalid_argument);
  CHECK(backend.announce(a, "\xff").error() == Errc::invalid_argument);
  CHECK(backend.leader(LockRef{table, "leader"}, 60s)->value == largest);
  // SQL that skips the library meets the CHECK.
  CHECK_THROWS(admin("UPDATE " + table + "_election SET leader_value = repeat('v', 7169)"));
}

TEST_CASE("a lock table not upgraded since elections came: the election's statements say what to run",
          "[election][sql]") {
  PostgresBackend backend("");
  const std::string table = fresh_table("election_old");
  make(backend, table);
  admin("DROP TABLE " + table + "_election");  // as made by a pgmutex before elections
  const HolderKey a = hold(backend, table, "leader", "a", 51);  // locks still work
  auto refused = backend.announce(a, "x");
  REQUIRE_FALSE(refused);
  CHECK(refused.error() == Errc::schema_missing);
  CHECK_THAT(refused.error().message(), Catch::Contains("pgmutex schema"));
  CHECK(backend.leader(LockRef{table, "leader"}, 60s).error() == Errc::schema_missing);
  REQUIRE(backend.release(a));
  make(backend, table);  // the upgrade
  const HolderKey b = hold(backend, table, "leader", "b", 52);
  CHECK(backend.announce(b, "x"));
}

TEST_CASE("elections through a Session: its connection, the same rules", "[election][sql][session]") {
  const std::string table = fresh_table("election_session");
  auto session = pgmutex::Session::create("");
  auto backend = session->backend();
  REQUIRE(backend.create_schema(table));
  AcquireRequest r{LockRef{table, "leader"}, "s", 60s, 61, 5s};
  auto won = backend.try_acquire(r);
  REQUIRE(won);
  REQUIRE(won->acquired);
  const HolderKey key{LockRef{table, "leader"}, "s", won->fence, 61, 5s};
  auto elected = backend.announce(key, "on a session");
  REQUIRE(elected);
  CHECK(elected->term == won->fence);
  auto read = backend.leader(LockRef{table, "leader"}, 60s);
  REQUIRE(read);
  CHECK(read->leading());
  CHECK(read->value == "on a session");
  auto vacated = backend.vacate(key);
  REQUIRE(vacated);
  CHECK_FALSE(vacated->leading());
  CHECK(vacated->change == 2);
  HolderKey other = key;
  other.fence += 1;
  CHECK(backend.announce(other, "x").error() == Errc::lock_not_held);
  REQUIRE(backend.release(key));
}

TEST_CASE("Election and SessionElection: campaign, leader(), proclaim, resign to the next in line",
          "[election][api]") {
  const std::string table = fresh_table("election_api");
  pgmutex::Election a(PostgresBackend(""), options(table, "primary", "a"));
  a.create_schema();
  auto session = pgmutex::Session::create("");
  pgmutex::SessionElection b(session->backend(), options(table, "primary", "b"));
  CHECK_FALSE(b.leader());

  auto lead = a.campaign("10.0.0.1:80", 5s);
  REQUIRE(lead);
  auto now = b.leader();
  REQUIRE(now);
  CHECK(now->term == lead.term());
  CHECK(now->value == "10.0.0.1:80");
  CHECK(now->instance_id == "a");
  lead.proclaim("10.0.0.1:81");
  CHECK(b.leader()->value == "10.0.0.1:81");

  // b waits in line while a leads; a resigns; b leads, with a higher term.
  std::optional<pgmutex::SessionElection::leadership_type> next;
  std::thread waiter([&] { next = b.campaign("10.0.0.2:80", 20s); });
  for (int i = 0; i < 100 && admin("SELECT count(*) FROM " + table + "_queue")[0][0].as<int>() == 0; ++i)
    std::this_thread::sleep_for(20ms);
  const Fence first = lead.term();
  lead.resign();
  waiter.join();
  REQUIRE(next);
  REQUIRE(*next);
  CHECK(next->term() > first);
  CHECK(a.leader()->instance_id == "b");
  // A candidate's own observer, on a connection of its own.
  auto follows = a.observer();
  auto now_leads = follows.next(5s);
  REQUIRE(now_leads);
  REQUIRE(now_leads->leader);
  CHECK(now_leads->leader->instance_id == "b");
  next.reset();  // resigns
  CHECK_FALSE(a.leader());
  auto vacated = follows.next(5s);
  REQUIRE(vacated);
  CHECK(vacated->event == pgmutex::LeaderEvent::vacated);
}

TEST_CASE("Election: leader() answers while the same object's campaign waits in line", "[election][api][reader]") {
  // The wait in line holds the object's connection (it LISTENs there): a
  // read through that connection would wait for the whole campaign.
  const std::string table = fresh_table("election_reader");
  pgmutex::Election a(PostgresBackend(""), options(table, "primary", "a"));
  a.create_schema();
  pgmutex::Election b(PostgresBackend(""), options(table, "primary", "b"));
  auto lead = a.campaign("10.0.0.1:80", 5s);
  REQUIRE(lead);
  std::optional<pgmutex::Election::leadership_type> next;
  std::thread waiter([&] { next = b.campaign("10.0.0.2:80", 10s); });
  for (int i = 0; i < 100 && admin("SELECT count(*) FROM " + table + "_queue")[0][0].as<int>() == 0; ++i)
    std::this_thread::sleep_for(20ms);
  auto read = std::async(std::launch::async, [&] { return b.leader(pgmutex::nothrow); });
  const bool answered = read.wait_for(5s) == std::future_status::ready;  // else only at the campaign's timeout
  CHECK(answered);
  auto seen = read.get();
  INFO((seen ? std::string() : seen.error().message()));
  REQUIRE(seen);
  REQUIRE(*seen);
  CHECK((*seen)->instance_id == "a");
  CHECK((*seen)->term == lead.term());
  CHECK(a.leader()->term == lead.term());  // the leader's own read, on its reader
  lead.resign();
  waiter.join();
  REQUIRE(next);
  REQUIRE(*next);
  CHECK(b.leader()->term == next->term());
}

namespace {

// The next change within 5 s, taking errors as a reconnect does (a
// terminated backend answers one error, then the observer reads again).
template <class Observer>
pgmutex::LeaderChange next_change(Observer& o) {
  for (int i = 0; i < 10; ++i) {
    auto c = o.next(pgmutex::nothrow, 5s);
    if (!c) {
      UNSCOPED_INFO("try " << i << ": " << c.error().message());
      continue;
    }
    REQUIRE(*c);
    return **c;
  }
  FAIL("no change within 10 tries");
  return {};
}

// When the observer's own backend (named by application_name) began its last statement.
std::string last_statement_of(const std::string& application) {
  auto r = admin("SELECT query_start::text || ' ' || query FROM pg_stat_activity WHERE application_name = '" +
                 application + "'");
  REQUIRE(r.size() == 1);
  return r[0][0].as<std::string>();
}

}  // namespace

TEST_CASE("Observer: the present, then every change in order from notifications alone, no statement per change",
          "[election][observe]") {
  const std::string table = fresh_table("election_observe");
  pgmutex::Election a(PostgresBackend(""), options(table, "primary", "a"));
  pgmutex::Election b(PostgresBackend(""), options(table, "primary", "b"));
  a.create_schema();
  const std::string app = "observer_" + table;
  pgmutex::Observer obs(PostgresBackend("application_name=" + app), options(table, "primary", "watcher"));

  auto first = next_change(obs);
  CHECK(first.event == pgmutex::LeaderEvent::current);
  CHECK_FALSE(first.leader);
  const std::string before = last_statement_of(app);

  auto lead = a.campaign("10.0.0.1:80", 5s);
  REQUIRE(lead);
  lead.proclaim("10.0.0.1:81");
  lead.resign();
  auto second = b.campaign("10.0.0.2:80", 5s);
  REQUIRE(second);

  const pgmutex::LeaderChange seen[] = {next_change(obs), next_change(obs), next_change(obs), next_change(obs)};
  CHECK(seen[0].event == pgmutex::LeaderEvent::elected);
  CHECK(seen[0].term == lead.term());
  REQUIRE(seen[0].leader);
  CHECK(seen[0].leader->value == "10.0.0.1:80");
  CHECK(seen[0].leader->instance_id == "a");
  CHECK(seen[1].event == pgmutex::LeaderEvent::proclaimed);
  CHECK(seen[1].leader->value == "10.0.0.1:81");
  CHECK(seen[2].event == pgmutex::LeaderEvent::vacated);
  CHECK(seen[3].event == pgmutex::LeaderEvent::elected);
  CHECK(seen[3].term == second.term());
  CHECK(seen[3].term > seen[0].term);
  for (const auto& c : seen) CHECK_FALSE(c.gap);
  // The four came as notifications: the observer made no statement since its first reading.
  CHECK(last_statement_of(app) == before);
}

TEST_CASE("Observer: changes missed while its backend was terminated come as a gap with their count",
          "[election][observe]") {
  const std::string table = fresh_table("election_observe_gap");
  pgmutex::Election a(PostgresBackend(""), options(table, "primary", "a"));
  a.create_schema();
  const std::string app = "observer_" + table;
  pgmutex::Observer obs(PostgresBackend("application_name=" + app), options(table, "primary", "watcher"));
  REQUIRE_FALSE(next_change(obs).leader);
  CHECK_FALSE(obs.next(200ms));  // listening now, nothing to report

  admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '" + app + "'");
  auto lead = a.campaign("one", 5s);
  REQUIRE(lead);
  lead.proclaim("two");
  lead.proclaim("three");

  auto after = next_change(obs);
  CHECK(after.gap);
  CHECK(after.missed == 2);
  CHECK(after.event == pgmutex::LeaderEvent::elected);
  REQUIRE(after.leader);
  CHECK(after.leader->value == "three");
  // And continuity after it.
  lead.proclaim("four");
  auto more = next_change(obs);
  CHECK(more.event == pgmutex::LeaderEvent::proclaimed);
  CHECK_FALSE(more.gap);
  CHECK(more.leader->value == "four");
}

TEST_CASE("SessionObserver: twenty observers on one Session share its LISTEN; every change reaches each, no "
          "statement per change; a lost connection comes as a gap",
          "[election][observe][session]") {
  const std::string table = fresh_table("election_observe_session");
  pgmutex::Election a(PostgresBackend(""), options(table, "primary", "a"));
  a.create_schema();
  const std::string app = "observers_" + table;
  auto session = pgmutex::Session::create("application_name=" + app);
  std::vector<pgmutex::SessionObserver> observers;
  for (int i = 0; i < 20; ++i)
    observers.emplace_back(session->backend(), options(table, "primary", "watcher" + std::to_string(i)));
  for (auto& o : observers) CHECK(next_change(o).event == pgmutex::LeaderEvent::current);
  const auto before = session->stats();

  auto lead = a.campaign("10.0.0.1:80", 5s);
  REQUIRE(lead);
  lead.proclaim("10.0.0.1:81");
  lead.resign();
  for (auto& o : observers) {
    const pgmutex::LeaderChange seen[] = {next_change(o), next_change(o), next_change(o)};
    CHECK(seen[0].event == pgmutex::LeaderEvent::elected);
    CHECK(seen[0].term == lead.term());
    CHECK(seen[1].event == pgmutex::LeaderEvent::proclaimed);
    CHECK(seen[1].leader->value == "10.0.0.1:81");
    CHECK(seen[2].event == pgmutex::LeaderEvent::vacated);
    for (const auto& c : seen) CHECK_FALSE(c.gap);
  }
  // Three changes heard by twenty observers: three NOTIFYs on one connection, no statement.
  CHECK(session->stats().statements == before.statements);
  CHECK(session->stats().notifications - before.notifications == 3);

  // The session's connection terminated: the next changes come as one gap
  // to each observer (they LISTEN again on the new connection and read).
  admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '" + app + "'");
  auto again = a.campaign("10.0.0.1:82", 5s);
  REQUIRE(again);
  again.proclaim("10.0.0.1:83");
  for (auto& o : observers) {
    auto after = next_change(o);
    CHECK(after.gap);
    CHECK(after.missed == 1);
    REQUIRE(after.leader);
    CHECK(after.leader->value == "10.0.0.1:83");
    CHECK(after.term == again.term());
  }
  again.proclaim("10.0.0.1:84");
  for (auto& o : observers) {
    auto more = next_change(o);
    CHECK(more.event == pgmutex::LeaderEvent::proclaimed);
    CHECK_FALSE(more.gap);
  }
}

TEST_CASE("SessionObserver: twenty observers at a stopped leader's stale deadline are each told expired; "
          "they share their readings of who leads",
          "[election][observe][session]") {
  const std::string table = fresh_table("election_observe_session_expiry");
  pgmutex::Options short_lease = options(table, "primary", "a");
  short_lease.heartbeat_interval = 200ms;
  short_lease.alert_threshold = 600ms;
  short_lease.stale_threshold = 1500ms;
  pgmutex::Election a(PostgresBackend(""), short_lease);
  a.create_schema();
  auto session = pgmutex::Session::create("");
  constexpr int count = 20;
  std::vector<std::unique_ptr<pgmutex::SessionObserver>> observers;
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::vector<pgmutex::LeaderChange>> seen(count);
  std::vector<std::jthread> threads;
  for (int i = 0; i < count; ++i) {
    pgmutex::Options reader = short_lease;
    reader.instance_id = "watcher" + std::to_string(i);
    observers.push_back(std::make_unique<pgmutex::SessionObserver>(session->backend(), reader));
  }
  auto lead = a.campaign("a", 5s);
  REQUIRE(lead);
  for (int i = 0; i < count; ++i)
    threads.emplace_back([&, i](std::stop_token stop) {
      while (!stop.stop_requested()) {
        auto c = observers[i]->next(pgmutex::nothrow, 200ms, stop);
        if (!c || !*c) continue;
        std::lock_guard lock(m);
        seen[i].push_back(**c);
        cv.notify_all();
      }
    });
  const auto all_have = [&](pgmutex::LeaderEvent event) {
    std::unique_lock lock(m);
    return cv.wait_for(lock, 10s, [&] {
      return std::all_of(seen.begin(), seen.end(), [&](const auto& v) { return !v.empty() && v.back().event == event; });
    });
  };
  REQUIRE(all_have(pgmutex::LeaderEvent::current));
  const auto before = session->stats().statements;
  // The leader's heartbeats stop reaching its row: another session holds the row lock.
  pqxx::connection blocker("");
  pqxx::work holding(blocker);
  holding.exec("SELECT 1 FROM " + table + " WHERE lock_name = 'primary' FOR UPDATE");
  CHECK(all_have(pgmutex::LeaderEvent::expired));
  const auto statements = session->stats().statements - before;
  holding.abort();
  threads.clear();
  for (const auto& v : seen) CHECK(v.back().term == lead.term());
  // Each observer read at the stale deadlines of the leader's row (until it
  // went stale), together with the others: fewer readings than observers
  // (each reading for itself makes one each, 20 here). Usually under 10; a
  // slow build spreads the observers' wake-ups over more readings (14 were
  // seen once under ThreadSanitizer, against a bound of 10 then).
  INFO("statements: " << statements);
  CHECK(statements < count);
}

TEST_CASE("Observer: a leader whose heartbeats stop is reported expired at its stale deadline",
          "[election][observe]") {
  const std::string table = fresh_table("election_observe_expiry");
  pgmutex::Options short_lease = options(table, "primary", "a");
  short_lease.heartbeat_interval = 200ms;
  short_lease.alert_threshold = 600ms;
  short_lease.stale_threshold = 1500ms;
  pgmutex::Election a(PostgresBackend(""), short_lease);
  a.create_schema();
  pgmutex::Options reader = short_lease;
  reader.instance_id = "watcher";
  pgmutex::Observer obs(PostgresBackend(""), reader);
  auto lead = a.campaign("a", 5s);
  REQUIRE(lead);
  REQUIRE(next_change(obs).leader);
  // The leader's heartbeats stop reaching its row: another session holds the row lock.
  pqxx::connection blocker("");
  pqxx::work holding(blocker);
  holding.exec("SELECT 1 FROM " + table + " WHERE lock_name = 'primary' FOR UPDATE");
  auto expired = next_change(obs);
  holding.abort();
  CHECK(expired.event == pgmutex::LeaderEvent::expired);
  CHECK(expired.term == lead.term());
  CHECK_FALSE(expired.leader);
}
