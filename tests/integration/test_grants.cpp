// A grant's identity in Postgres: its token and its holder's stale threshold
// stored with it (also in a table the seed's DDL made), heartbeats and
// releases that match on the token, a losing try that names the current
// holder even when it raced, and a lock whose identity is the table's oid,
// not its spelling.
#include <atomic>
#include <mutex>
#include <thread>

#include "support.hpp"

using namespace itest;
using pgmutex::AcquireRequest;
using pgmutex::Errc;
using pgmutex::GrantToken;
using pgmutex::HolderKey;
using pgmutex::LockRef;
using pgmutex::PostgresBackend;

namespace {

AcquireRequest request(const std::string& table, const std::string& lock, const std::string& instance,
                       std::chrono::nanoseconds stale, GrantToken token) {
  return AcquireRequest{LockRef{table, lock}, instance, stale, token, 10s};
}

HolderKey key(const std::string& table, const std::string& lock, const std::string& instance, pgmutex::Fence fence,
              GrantToken token) {
  return HolderKey{LockRef{table, lock}, instance, fence, token, 5s};
}

// A token with the high bit set: stored as a negative BIGINT, read back the same.
constexpr GrantToken big_token = 0xF000'0000'0000'0001ULL;

}  // namespace

TEST_CASE("a table made by the seed's DDL is upgraded: its rows have no token and are reclaimed when stale; "
          "new grants store token and threshold",
          "[grants][schema]") {
  const std::string seed_table = seed_made_table("seedgrants");
  const std::string schema = seed_table.substr(0, seed_table.find('.'));
  admin("INSERT INTO " + schema + ".mutex_lock VALUES ('live', 1, 'seed-live', now(), now()), "
        "('dead', 1, 'seed-dead', now() - interval '1 hour', now() - interval '1 hour')");
  const std::string table = schema + ".mutex_lock";
  PostgresBackend b("");
  REQUIRE(b.create_schema(table));
  REQUIRE(b.create_schema(table));
  CHECK(admin("SELECT count(*) FROM information_schema.columns WHERE table_schema = '" + schema +
              "' AND column_name IN ('fence', 'grant_token', 'holder_stale_s')")[0][0].as<int>() == 3);

  // The seed's rows: inspected with token 0 and no threshold, beaten with token 0.
  auto live = b.inspect(LockRef{table, "live"});
  REQUIRE(live);
  REQUIRE(live->has_value());
  CHECK((*live)->instance_id == "seed-live");
  CHECK((*live)->token == 0u);
  CHECK((*live)->stale_threshold == 0s);
  CHECK(b.heartbeat(key(table, "live", "seed-live", (*live)->fence, 0)));
  CHECK(b.heartbeat(key(table, "live", "seed-live", (*live)->fence, 5)).error() == Errc::lock_not_held);
  auto lost = b.try_acquire(request(table, "live", "me", 60s, 7));
  REQUIRE(lost);
  CHECK_FALSE(lost->acquired);
  CHECK(lost->holder == "seed-live");
  CHECK(lost->holder_token == 0u);

  // A stale seed row (no stored threshold: the reclaimer's counts) is taken over.
  auto taken = b.try_acquire(request(table, "dead", "me", 60s, big_token));
  REQUIRE(taken);
  CHECK(taken->acquired);
  CHECK(taken->reclaimed);
  CHECK(taken->holder == "seed-dead");
  auto row = b.inspect(LockRef{table, "dead"});
  REQUIRE(row);
  REQUIRE(row->has_value());
  CHECK((*row)->token == big_token);
  CHECK((*row)->stale_threshold == 60s);
  auto listed = b.list(table);
  REQUIRE(listed);
  REQUIRE(listed->size() == 2);
  CHECK((*listed)[0].lock_name == "dead");
  CHECK((*listed)[0].token == big_token);
  CHECK((*listed)[0].stale_threshold == 60s);

  auto loser = b.try_acquire(request(table, "dead", "other", 60s, 9));
  REQUIRE(loser);
  CHECK_FALSE(loser->acquired);
  CHECK(loser->holder_token == big_token);

  // Heartbeat and release match on the token.
  CHECK(b.heartbeat(key(table, "dead", "me", taken->fence, 0)).error() == Errc::lock_not_held);
  CHECK(b.heartbeat(key(table, "dead", "me", taken->fence, big_token)));
  CHECK(b.release(key(table, "dead", "me", taken->fence, 1)).error() == Errc::lock_not_held);
  CHECK(b.release(key(table, "dead", "me", taken->fence, big_token)));
}

TEST_CASE("a reclaim needs the row older than the larger of the reclaimer's and the holder's threshold",
          "[grants][threshold]") {
  const std::string table = fresh_table("threshold");
  PostgresBackend holder("");
  PostgresBackend reclaimer("");
  REQUIRE(holder.create_schema(table));
  REQUIRE(holder.try_acquire(request(table, "patient", "holder", 30s, 1)));  // holder: 30 s
  REQUIRE(holder.try_acquire(request(table, "hasty", "holder", 100ms, 2)));  // holder: 0.1 s
  admin("INSERT INTO " + table + " (lock_name, instance_id, last_heartbeat, acquired_at) VALUES "
        "('seed', 'seed-holder', now() - interval '2 seconds', now() - interval '2 seconds')");
  std::this_thread::sleep_for(400ms);

  // A misconfigured reclaimer (0.1 s) cannot break a holder that asked for 30 s.
  auto refused = reclaimer.try_acquire(request(table, "patient", "reclaimer", 100ms, 3));
  REQUIRE(refused);
  CHECK_FALSE(refused->acquired);
  CHECK(refused->holder == "holder");
  CHECK(refused->holder_age_s >= 0.3);
  // The larger one counts either way: 0.2 s (the reclaimer's) against a 0.4 s old row.
  auto taken = reclaimer.try_acquire(request(table, "hasty", "reclaimer", 200ms, 4));
  REQUIRE(taken);
  CHECK(taken->acquired);
  CHECK(taken->reclaimed);
  // A seed row stores none: the reclaimer's threshold alone.
  auto not_yet = reclaimer.try_acquire(request(table, "seed", "reclaimer", 10s, 5));
  REQUIRE(not_yet);
  CHECK_FALSE(not_yet->acquired);
  auto seed_taken = reclaimer.try_acquire(request(table, "seed", "reclaimer", 1s, 6));
  REQUIRE(seed_taken);
  CHECK(seed_taken->acquired);
  CHECK(seed_taken->reclaimed);
}

TEST_CASE("a losing try that raced names the current holder, or wins a row that went away", "[grants][race]") {
  const std::string table = fresh_table("race");
  PostgresBackend a("");
  PostgresBackend b("");
  REQUIRE(a.create_schema(table));
  REQUIRE(b.connect());
  const auto plant_stale_row = [&] {
    admin("DELETE FROM " + table);
    admin("INSERT INTO " + table + " (lock_name, instance_id, last_heartbeat, acquired_at) VALUES "
          "('job', 'dead', now() - interval '1 hour', now() - interval '1 hour')");
  };

  SECTION("two reclaimers of one stale row: the loser names the winner, with a fresh age") {
    plant_stale_row();
    // Both reclaimers see the stale row and queue on its row lock behind this session.
    pqxx::connection c("");
    pqxx::work blocker(c);
    blocker.exec("SELECT 1 FROM " + table + " WHERE lock_name = 'job' FOR UPDATE");
    pgmutex::Result<pgmutex::AcquireResult> ra, rb;
    std::thread ta([&] { ra = a.try_acquire(request(table, "job", "A", 10s, 101)); });
    std::thread tb([&] { rb = b.try_acquire(request(table, "job", "B", 10s, 102)); });
    std::this_thread::sleep_for(500ms);
    blocker.commit();
    ta.join();
    tb.join();
    REQUIRE(ra);
    REQUIRE(rb);
    REQUIRE(ra->acquired != rb->acquired);
    const auto& winner = ra->acquired ? *ra : *rb;
    const auto& loser = ra->acquired ? *rb : *ra;
    CHECK(winner.reclaimed);
    CHECK(winner.holder == "dead");
    CHECK(loser.holder == (ra->acquired ? "A" : "B"));
    CHECK(loser.holder_token == (ra->acquired ? 101u : 102u));
    CHECK(loser.fence == winner.fence);
    CHECK(loser.holder_age_s < 5.0);
  }
  SECTION("a reclaimer whose stale row is removed while it waits takes the lock") {
    plant_stale_row();
    pqxx::connection c("");
    pqxx::work remover(c);
    remover.exec("DELETE FROM " + table + " WHERE lock_name = 'job'");
    pgmutex::Result<pgmutex::AcquireResult> ra;
    std::thread ta([&] { ra = a.try_acquire(request(table, "job", "A", 10s, 201)); });
    std::this_thread::sleep_for(500ms);
    remover.commit();
    ta.join();
    REQUIRE(ra);
    CHECK(ra->acquired);
    CHECK_FALSE(ra->reclaimed);
    auto row = b.inspect(LockRef{table, "job"});
    REQUIRE(row);
    REQUIRE(row->has_value());
    CHECK((*row)->instance_id == "A");
    CHECK((*row)->token == 201u);
  }
}

TEST_CASE("two holders with one instance_id: one's heartbeat and release never touch the other's grant",
          "[grants][token]") {
  const std::string table = fresh_table("sameinstance");
  PostgresBackend first("");
  PostgresBackend second("");
  REQUIRE(first.create_schema(table));
  auto won = first.try_acquire(request(table, "job", "same", 60s, 1001));
  REQUIRE(won);
  REQUIRE(won->acquired);
  // `second` believes it holds the same grant (same instance, same fence) under another token.
  CHECK(second.heartbeat(key(table, "job", "same", won->fence, 1002)).error() == Errc::lock_not_held);
  CHECK(second.release(key(table, "job", "same", won->fence, 1002)).error() == Errc::lock_not_held);
  std::vector<HolderKey> keys{key(table, "job", "same", won->fence, 1002), key(table, "job", "same", won->fence, 1001)};
  auto held = second.heartbeat_many(keys);
  REQUIRE(held);
  CHECK_FALSE((*held)[0]);
  CHECK((*held)[1]);
  auto row = first.inspect(LockRef{table, "job"});
  REQUIRE(row);
  REQUIRE(row->has_value());
  CHECK((*row)->token == 1001u);
  CHECK(first.heartbeat(key(table, "job", "same", won->fence, 1001)));
  CHECK(first.release(key(table, "job", "same", won->fence, 1001)));
}

TEST_CASE("the lock's identity is the table's oid: two spellings serialize and wake each other", "[grants][oid]") {
  const std::string bare = fresh_table("oid");
  const std::string qualified = "public." + bare;
  PostgresBackend plain("");
  PostgresBackend schema_qualified("");
  REQUIRE(plain.create_schema(bare));

  SECTION("one NOTIFY channel") {
    auto c1 = plain.release_channel(LockRef{bare, "job"});
    auto c2 = schema_qualified.release_channel(LockRef{qualified, "job"});
    REQUIRE(c1);
    REQUIRE(c2);
    CHECK(*c1 == *c2);

    auto won = plain.try_acquire(request(bare, "job", "H", 60s, 1));
    REQUIRE(won);
    REQUIRE(won->acquired);
    std::thread releaser([&] {
      std::this_thread::sleep_for(300ms);
      CHECK(plain.release(key(bare, "job", "H", won->fence, 1)));
    });
    auto woke = schema_qualified.wait_for_release(LockRef{qualified, "job"}, 5s);
    releaser.join();
    REQUIRE(woke);
    CHECK(*woke);
  }
  SECTION("inserters of both spellings draw fences in grant order") {
    // The slow inserter draws its fence, then sleeps in a trigger before its
    // row exists. Were the advisory key made from the spelling, the fast one
    // would insert, be granted and release meanwhile, and the slow one would
    // then be granted a lower fence than a grant before it.
    admin("CREATE FUNCTION " + bare + "_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
          "IF NEW.instance_id = 'slow' THEN PERFORM pg_sleep(1); END IF; RETURN NEW; END $$");
    admin("CREATE TRIGGER slow BEFORE INSERT ON " + bare + " FOR EACH ROW EXECUTE FUNCTION " + bare + "_slow()");
    std::mutex m;
    std::vector<std::pair<std::string, pgmutex::Fence>> grants;  // in the order they were granted
    pgmutex::Result<pgmutex::AcquireResult> slow, fast;
    std::thread ts([&] {
      slow = plain.try_acquire(request(bare, "job", "slow", 60s, 1));
      if (slow && slow->acquired) {
        std::lock_guard lock(m);
        grants.emplace_back("slow", slow->fence);
      }
    });
    std::this_thread::sleep_for(300ms);
    fast = schema_qualified.try_acquire(request(qualified, "job", "fast", 60s, 2));
    if (fast && fast->acquired) {
      {
        std::lock_guard lock(m);
        grants.emplace_back("fast", fast->fence);
      }
      CHECK(schema_qualified.release(key(qualified, "job", "fast", fast->fence, 2)));
    }
    ts.join();
    REQUIRE(slow);
    REQUIRE(fast);
    CHECK(slow->acquired);
    for (std::size_t i = 1; i < grants.size(); ++i) {
      INFO(grants[i - 1].first << " got " << grants[i - 1].second << ", then " << grants[i].first << " got "
                               << grants[i].second);
      CHECK(grants[i].second > grants[i - 1].second);
    }
    if (!fast->acquired) CHECK(fast->holder == "slow");  // it waited for the slow grant, and names it
  }
}
