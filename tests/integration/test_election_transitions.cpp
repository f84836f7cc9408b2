// [election][transitions]: one statement per transition of an election
// (issue 18, phase 6) on a real server. A resign is one statement (the
// release that vacates the term and hands the lock to the next in line), and
// the successor's campaign one (its confirm, which announces): counted on
// two Sessions' connections; on own connections the rows each writes carry
// one transaction's time; observers hear vacated, then elected, in order,
// with no gap. A grant the server will not announce leaves no leader and
// the lock handed on.
#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "pgmutex/session.hpp"
#include "support.hpp"

using namespace itest;
using pgmutex::Errc;
using pgmutex::Fence;
using pgmutex::PostgresBackend;

namespace {

int queued(const std::string& table) { return admin("SELECT count(*) FROM " + table + "_queue")[0][0].as<int>(); }

// Waits up to 5 s until `n` wait in the table's queue.
void until_queued(const std::string& table, int n) {
  for (int i = 0; i < 250 && queued(table) != n; ++i) std::this_thread::sleep_for(20ms);
  REQUIRE(queued(table) == n);
}

// Statements a Session's connection sent, its batched heartbeats aside.
std::uint64_t statements(const std::shared_ptr<pgmutex::Session>& s) {
  const auto stats = s->stats();
  return stats.statements - stats.heartbeat_statements;
}

// The next change within 5 s.
pgmutex::LeaderChange next_change(pgmutex::Observer& o) {
  auto c = o.next(pgmutex::nothrow, 5s);
  INFO((c ? std::string() : c.error().message()));
  REQUIRE(c);
  REQUIRE(*c);
  return **c;
}

}  // namespace

TEST_CASE("SessionElection: resign -> successor costs one statement on each side; observers hear each change in order",
          "[election][transitions]") {
  const std::string table = fresh_table("election_transitions");
  auto one = pgmutex::Session::create("");
  auto two = pgmutex::Session::create("");
  pgmutex::SessionElection a(one->backend(), options(table, "primary", "a"));
  pgmutex::SessionElection b(two->backend(), options(table, "primary", "b"));
  a.create_schema();
  pgmutex::Observer obs(PostgresBackend(""), options(table, "primary", "watcher"));
  CHECK_FALSE(next_change(obs).leader);  // the present: nobody

  // The leader resigns while `next` waits in line; returns the successor's leadership.
  using Leadership = pgmutex::SessionElection::leadership_type;
  const auto hand_over = [&](Leadership& from, pgmutex::SessionElection& next, const std::string& value,
                             const std::shared_ptr<pgmutex::Session>& leader_session,
                             const std::shared_ptr<pgmutex::Session>& next_session) {
    std::optional<Leadership> got;
    std::thread waiter([&] { got = next.campaign(value, 20s); });
    until_queued(table, 1);
    std::this_thread::sleep_for(50ms);  // its enqueue's answer read: it waits, sending nothing
    const auto leader_before = statements(leader_session);
    const auto next_before = statements(next_session);
    from.resign();
    waiter.join();
    REQUIRE(got);
    REQUIRE(*got);
    return std::tuple(std::move(*got), statements(leader_session) - leader_before, statements(next_session) - next_before);
  };

  // A free lock: the campaign is one try, which grants and announces.
  const auto free_before = statements(one);
  auto first = a.campaign("a-1", 5s);
  REQUIRE(first);
  CHECK(statements(one) - free_before <= 2);  // the try, and its statement's preparation the first time
  // The first handovers prepare each side's statements; the third is counted.
  auto [second, r1, s1] = hand_over(first, b, "b-1", one, two);
  auto [third, r2, s2] = hand_over(second, a, "a-2", two, one);
  auto [fourth, resign_statements, successor_statements] = hand_over(third, b, "b-2", one, two);
  INFO("first handovers: " << r1 << "+" << s1 << ", " << r2 << "+" << s2);
  CHECK(resign_statements == 1);      // the release that vacates and offers
  CHECK(successor_statements == 1);   // the confirm that announces
  CHECK(fourth.term() > third.term());
  auto now = a.leader();
  REQUIRE(now);
  CHECK(now->instance_id == "b");
  CHECK(now->value == "b-2");
  CHECK(now->term == fourth.term());

  // Every change, from notifications: elected, then vacated and elected at each handover, no gap.
  const pgmutex::LeaderEvent expected[] = {pgmutex::LeaderEvent::elected, pgmutex::LeaderEvent::vacated,
                                           pgmutex::LeaderEvent::elected, pgmutex::LeaderEvent::vacated,
                                           pgmutex::LeaderEvent::elected, pgmutex::LeaderEvent::vacated,
                                           pgmutex::LeaderEvent::elected};
  const char* values[] = {"a-1", nullptr, "b-1", nullptr, "a-2", nullptr, "b-2"};
  std::int64_t change = 0;
  Fence term = 0;
  for (std::size_t i = 0; i < std::size(expected); ++i) {
    const auto c = next_change(obs);
    INFO("change " << i);
    CHECK(c.event == expected[i]);
    CHECK_FALSE(c.gap);
    CHECK(c.change == change + 1);
    change = c.change;
    if (values[i] != nullptr) {
      REQUIRE(c.leader);
      CHECK(c.leader->value == values[i]);
      CHECK(c.term > term);
      term = c.term;
    } else {
      CHECK_FALSE(c.leader);
      CHECK(c.term == term);  // the term that ended
    }
  }
  CHECK(term == fourth.term());
}

TEST_CASE("Election: the grant and its announcement, the vacancy and the handoff, are one transaction each",
          "[election][transitions]") {
  // now() is a transaction's start: rows written by one transaction carry
  // the same one, rows written by two never do.
  const std::string table = fresh_table("election_transitions_own");
  pgmutex::Election a(PostgresBackend(""), options(table, "primary", "a"));
  // b's confirm keeps its flush: one that skips it heartbeats at once, and
  // the row's last_heartbeat would no longer be the confirm's.
  pgmutex::PostgresOptions flushed;
  flushed.unflushed_confirm_window = std::nullopt;
  pgmutex::Election b(PostgresBackend("", flushed), options(table, "primary", "b"));
  pgmutex::Mutex c(PostgresBackend(""), options(table, "primary", "c"));
  a.create_schema();
  pgmutex::Observer obs(PostgresBackend(""), options(table, "primary", "watcher"));
  CHECK_FALSE(next_change(obs).leader);
  const auto same_transaction = [&](const std::string& election_column, const std::string& lock_column) {
    return admin("SELECT e." + election_column + " = t." + lock_column + " FROM " + table + "_election AS e, " + table +
                 " AS t WHERE e.lock_name = 'primary' AND t.lock_name = 'primary'")[0][0].as<bool>();
  };

  auto lead = a.campaign("a", 5s);  // a free lock: the try that grants announces
  REQUIRE(lead);
  CHECK(same_transaction("since", "acquired_at"));

  std::optional<pgmutex::Election::leadership_type> next;
  std::thread waiter([&] { next = b.campaign("b", 20s); });
  until_queued(table, 1);
  lead.resign();
  waiter.join();
  REQUIRE(next);
  REQUIRE(*next);
  CHECK(same_transaction("since", "last_heartbeat"));  // b's confirm of the offer announced (no heartbeat yet)

  std::optional<pgmutex::Mutex::guard_type> held;
  std::thread mutex_waits([&] { held = c.acquire(20s); });
  until_queued(table, 1);
  next->resign();  // vacated in the release that offers the lock to c
  mutex_waits.join();
  REQUIRE(held);
  REQUIRE(*held);
  CHECK(same_transaction("changed_at", "acquired_at"));
  CHECK_FALSE(admin("SELECT announced FROM " + table + "_election")[0][0].as<bool>());

  const pgmutex::LeaderChange seen[] = {next_change(obs), next_change(obs), next_change(obs), next_change(obs)};
  CHECK(seen[0].event == pgmutex::LeaderEvent::elected);
  CHECK(seen[1].event == pgmutex::LeaderEvent::vacated);
  CHECK(seen[2].event == pgmutex::LeaderEvent::elected);
  CHECK(seen[3].event == pgmutex::LeaderEvent::vacated);
  for (int i = 1; i < 4; ++i) {
    CHECK(seen[i].change == seen[i - 1].change + 1);
    CHECK_FALSE(seen[i].gap);
  }
  REQUIRE(seen[2].leader);
  CHECK(seen[2].leader->instance_id == "b");
  CHECK(seen[2].term == next->term());
}

TEST_CASE("Election: a grant the server will not announce leaves no leader, and the lock goes to the next in line",
          "[election][transitions]") {
  const std::string table = fresh_table("election_transitions_refused");
  pgmutex::Election a(PostgresBackend(""), options(table, "primary", "a"));
  pgmutex::Election b(PostgresBackend(""), options(table, "primary", "b"));
  pgmutex::Mutex c(PostgresBackend(""), options(table, "primary", "c"));
  a.create_schema();
  auto lead = a.campaign("a", 5s);
  REQUIRE(lead);

  std::optional<pgmutex::Result<pgmutex::Election::leadership_type>> b_got;
  std::thread b_waits([&] { b_got = b.campaign(pgmutex::nothrow, "b", 20s); });
  until_queued(table, 1);
  std::optional<pgmutex::Mutex::guard_type> c_got;
  std::thread c_waits([&] { c_got = c.acquire(20s); });
  until_queued(table, 2);
  // The record now shows a term above any grant's fence (a fence sequence
  // restarted under a table that kept its elections): b's confirm may not
  // announce its term.
  admin("UPDATE " + table + "_election SET term = term + 1000000000000000");
  lead.resign();
  b_waits.join();
  c_waits.join();
  REQUIRE(b_got);
  REQUIRE_FALSE(*b_got);
  CHECK(b_got->error() == Errc::lock_not_held);
  REQUIRE(c_got);
  CHECK(*c_got);  // b gave the lock up at once: the next in line holds it
  CHECK_FALSE(a.leader());
  CHECK(queued(table) == 0);
}
