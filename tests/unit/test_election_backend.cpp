// Elections in the in-memory backend (issue 18, phase 1): the rules of the
// Postgres backend's election_sql.cpp (tests/integration/test_election.cpp),
// here on virtual time: who leads, announce and proclaim keyed by the grant,
// a retry that changes nothing, vacate, the count across terms, a stale or
// taken-over term, the value's bound, and what a failover keeps.
#include <catch2/catch.hpp>

#include "pgmutex/memory_backend.hpp"
#include "pgmutex/testing/manual_clock.hpp"

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
