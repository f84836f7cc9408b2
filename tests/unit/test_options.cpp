// Options validation and errors. Includes its headers first: they are self-contained.
#include "pgmutex/options.hpp"
#include "pgmutex/table_name.hpp"
#include "pgmutex/error.hpp"

#include <catch2/catch.hpp>

using namespace pgmutex;
using namespace std::chrono_literals;

namespace {
Options valid() { return Options{.lock_name = "job", .instance_id = "a"}; }

std::string rejection(Options o) {
  auto r = validate(std::move(o));
  REQUIRE_FALSE(r);
  CHECK(r.error() == Errc::invalid_argument);
  return r.error().detail;
}
}  // namespace

TEST_CASE("defaults follow the seed: 10 s heartbeat, 30 s alert, 600 s stale", "[options]") {
  auto r = validate(valid());
  REQUIRE(r);
  CHECK(r->heartbeat_interval == 10s);
  CHECK(r->alert_threshold == 30s);
  CHECK(r->stale_threshold == 600s);
  CHECK(r->poll_interval == 500ms);
  CHECK(r->table == "mutex_lock");
  CHECK(r->safety_margin == 60s);
  CHECK(r->lease() == 540s);
}

TEST_CASE("lock_name is 1..64 characters, counted as VARCHAR counts them", "[options]") {
  CHECK_THAT(rejection(Options{.lock_name = "", .instance_id = "a"}), Catch::Contains("lock_name must not be empty"));
  CHECK(validate(Options{.lock_name = std::string(64, 'x'), .instance_id = "a"}));
  CHECK_THAT(rejection(Options{.lock_name = std::string(65, 'x'), .instance_id = "a"}),
             Catch::Contains("lock_name must be at most 64 characters, got 65"));
  // 64 two-byte characters are 128 bytes but 64 characters: allowed.
  std::string accented;
  for (int i = 0; i < 64; ++i) accented += "\xC3\xA9";  // é
  CHECK(validate(Options{.lock_name = accented, .instance_id = "a"}));
  CHECK_THAT(rejection(Options{.lock_name = accented + "x", .instance_id = "a"}), Catch::Contains("got 65"));
  CHECK_THAT(rejection(Options{.lock_name = "bad\xFF", .instance_id = "a"}), Catch::Contains("valid UTF-8"));
  // What Postgres refuses as UTF-8 (found by tests/fuzz): overlong forms, surrogates, above U+10FFFF.
  for (const char* invalid : {"\xC0\x80", "\xE0\x80\x80", "\xF0\x80\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80"})
    CHECK_THAT(rejection(Options{.lock_name = invalid, .instance_id = "a"}), Catch::Contains("valid UTF-8"));
  CHECK(utf8_length("\xED\x9F\xBF\xEE\x80\x80\xF4\x8F\xBF\xBF\xF0\x90\x80\x80") == 4u);  // U+D7FF U+E000 U+10FFFF U+10000
  CHECK_THAT(rejection(Options{.lock_name = std::string("a\0b", 3), .instance_id = "a"}), Catch::Contains("NUL"));
}

TEST_CASE("instance_id defaults to <hostname>-<random> and follows the same rule", "[options]") {
  auto a = validate(Options{.lock_name = "job"});
  auto b = validate(Options{.lock_name = "job"});
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->instance_id != b->instance_id);
  CHECK(utf8_length(a->instance_id).value() <= 64);
  CHECK(a->instance_id.find('-') != std::string::npos);
  CHECK_THAT(rejection(Options{.lock_name = "job", .instance_id = std::string(65, 'i')}),
             Catch::Contains("instance_id must be at most 64 characters"));
}

TEST_CASE("thresholds must be ordered: heartbeat < alert < stale", "[options]") {
  auto o = valid();
  o.heartbeat_interval = 30s;
  CHECK_THAT(rejection(o), Catch::Contains("heartbeat_interval (30s) must be < alert_threshold (30s)"));
  o = valid();
  o.alert_threshold = 700s;
  CHECK_THAT(rejection(o), Catch::Contains("alert_threshold (700s) must be < stale_threshold (600s)"));
  o = valid();
  o.heartbeat_interval = 0s;
  CHECK_THAT(rejection(o), Catch::Contains("heartbeat_interval must be > 0"));
  o = valid();
  o.poll_interval = -1s;
  CHECK_THAT(rejection(o), Catch::Contains("poll_interval must be > 0"));
}

TEST_CASE("the safety margin leaves the holder time for a heartbeat", "[options]") {
  auto o = valid();
  o.safety_margin = 0s;
  CHECK_THAT(rejection(o), Catch::Contains("safety_margin must be > 0"));
  o.safety_margin = 595s;
  CHECK_THAT(rejection(o), Catch::Contains("must be > heartbeat_interval"));
  o.safety_margin = 100s;
  auto r = validate(o);
  REQUIRE(r);
  CHECK(r->lease() == 500s);
  // Short thresholds get a margin that still fits.
  auto tight = validate(Options{.lock_name = "job", .instance_id = "a", .heartbeat_interval = 1s,
                                .alert_threshold = 2s, .stale_threshold = 3s});
  REQUIRE(tight);
  CHECK(tight->lease() > tight->heartbeat_interval);
}

TEST_CASE("table follows psql's identifier rules, never SQL", "[options][table]") {
  for (const char* good : {"mutex_lock", "locks2", "_x", "app.mutex_lock", "\"lock-table\"", "Locks.Jobs", "x$1",
                           "\"a\"\"b\"", "\"Locks\".\"Jobs\"", "m\xC3\xA9"}) {
    auto o = valid();
    o.table = good;
    CAPTURE(good);
    CHECK(validate(o));
  }
  for (const char* bad : {"", "1abc", "mutex lock", "x;DROP TABLE users", "a\"b", "a.b.c", ".x", "x.", "\"\"",
                          "\"open", "m\xC3", "$x"}) {
    auto o = valid();
    o.table = bad;
    CAPTURE(bad);
    CHECK_THAT(rejection(o), Catch::Contains("each part an identifier as psql reads it"));
  }
  auto o = valid();
  o.table = std::string(64, 't');
  CHECK_THAT(rejection(o), Catch::Contains("a part of 64 bytes, which Postgres would cut short"));
  o.table = "\"" + std::string(63, 'T') + "\"";
  CHECK(validate(o));
}

TEST_CASE("a table name reads as psql reads it: unquoted parts fold to lower case", "[options][table]") {
  const auto read = [](std::string_view text) { return pgmutex::parse_table_name(text).value(); };
  CHECK(read("Locks.Jobs").schema == "locks");
  CHECK(read("Locks.Jobs").name == "jobs");
  CHECK(read("\"Locks\".Jobs").schema == "Locks");
  CHECK(read("\"lock-table\"").name == "lock-table");
  CHECK(read("\"a\"\"b\"").name == "a\"b");
  CHECK(read("mutex_lock").schema.empty());
  // Printed as a user types it: bare when psql reads it back unchanged.
  CHECK(pgmutex::sql_name(read("Locks.Jobs")) == "locks.jobs");
  CHECK(pgmutex::sql_name(read("\"Locks\".\"lock-table\"")) == "\"Locks\".\"lock-table\"");
}

TEST_CASE("derived names fit in 63 bytes and never collide", "[options][table]") {
  using pgmutex::TableName;
  // Up to 53 bytes: the names every table always had.
  CHECK(pgmutex::fence_sequence_of(TableName{"app", "mutex_lock"}).name == "mutex_lock_fence_seq");
  CHECK(pgmutex::fence_sequence_of(TableName{"app", "mutex_lock"}).schema == "app");
  CHECK(pgmutex::unique_constraint_of(TableName{"", "mutex_lock"}) == "uq_mutex_lock");
  CHECK(pgmutex::fence_sequence_of(TableName{"", std::string(53, 'a')}).name == std::string(53, 'a') + "_fence_seq");
  // Longer: cut, with a hash of the whole name, so two with a common prefix differ.
  const std::string a = std::string(61, 'x') + "_a", b = std::string(61, 'x') + "_b";
  for (const auto& name : {a, b, std::string(58, 'y'), std::string(63, 'z')}) {
    CAPTURE(name);
    CHECK(pgmutex::fence_sequence_of(TableName{"", name}).name.size() <= 63);
    CHECK(pgmutex::unique_constraint_of(TableName{"", name}).size() <= 63);
    CHECK_THAT(pgmutex::fence_sequence_of(TableName{"", name}).name, Catch::EndsWith("_fence_seq"));
  }
  CHECK(pgmutex::fence_sequence_of(TableName{"", a}).name != pgmutex::fence_sequence_of(TableName{"", b}).name);
  CHECK(pgmutex::unique_constraint_of(TableName{"", a}) != pgmutex::unique_constraint_of(TableName{"", b}));
  // Never cut inside a character.
  std::string wide(41, 'w');
  for (int i = 0; i < 8; ++i) wide += "\xC3\xA9";  // the cut falls inside the second é
  CHECK(pgmutex::utf8_length(pgmutex::fence_sequence_of(TableName{"", wide}).name));
}

TEST_CASE("errors map to exception types that derive from std::system_error", "[options][errors]") {
  CHECK_THROWS_AS(throw_error(Error(Errc::lock_not_held, "x")), LockNotHeldError);
  CHECK_THROWS_AS(throw_error(Error(Errc::lease_lost, "x")), LockNotHeldError);
  CHECK_THROWS_AS(throw_error(Error(Errc::already_acquired, "x")), LockHeldError);
  CHECK_THROWS_AS(throw_error(Error(Errc::invalid_argument, "x")), InvalidArgumentError);
  CHECK_THROWS_AS(throw_error(Error(Errc::backend_unavailable, "x")), BackendError);
  CHECK_THROWS_AS(throw_error(Error(Errc::timeout, "x")), LockTimeoutError);
  try {
    throw_error(Error(Errc::lock_not_held, "lock 'job': row gone"));
  } catch (const std::system_error& e) {
    CHECK(e.code() == Errc::lock_not_held);
    CHECK_THAT(e.what(), Catch::Contains("lock 'job': row gone") && Catch::Contains("lock not held"));
  }
  CHECK(Error(Errc::timeout).message() == "timed out");
  CHECK(make_error_code(Errc::backend_unavailable).category().name() == std::string("pgmutex"));
}

TEST_CASE("the safety margin covers one heartbeat attempt, and an interval more for asynchronous commits",
          "[options][guarantee]") {
  const BackendTraits async{.heartbeat_commits_asynchronously = true};
  // The seed's defaults (10 / 30 / 600 s) still validate, asynchronous commits included.
  auto seed = validate(valid(), async);
  REQUIRE(seed);
  CHECK(seed->safety_margin == 60s);
  CHECK(seed->heartbeat_timeout == 10s);

  auto o = valid();
  o.safety_margin = 20s;
  o.heartbeat_timeout = 25s;
  CHECK_THAT(rejection(o), Catch::Contains("safety_margin (20s) must be >= heartbeat_timeout (25s)"));
  o.heartbeat_timeout = 15s;
  CHECK(validate(o));  // synchronous: 20 s covers a 15 s attempt
  auto r = validate(o, async);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().detail, Catch::Contains("heartbeat_timeout (15s) + heartbeat_interval (10s"));
  CHECK_THAT(r.error().detail, Catch::Contains("= 25s"));
  o.heartbeat_timeout = 0s;
  CHECK_THAT(rejection(o), Catch::Contains("heartbeat_timeout must be > 0"));

  // Short thresholds get defaults that fit the rule, asynchronous commits included.
  auto tight = validate(Options{.lock_name = "job", .instance_id = "a", .heartbeat_interval = 1s,
                                .alert_threshold = 2s, .stale_threshold = 4s},
                        async);
  REQUIRE(tight);
  CHECK(tight->safety_margin >= tight->heartbeat_timeout + tight->heartbeat_interval);
}

TEST_CASE("the handoff deadline defaults to 2 s and never outlives a lease", "[options][queue]") {
  auto seed = validate(valid());
  REQUIRE(seed);
  CHECK(seed->handoff_deadline == 2s);
  // A lease shorter than 2 s gives the default its length.
  auto tight = validate(Options{.lock_name = "job", .instance_id = "a", .heartbeat_interval = 200ms,
                                .alert_threshold = 1s, .stale_threshold = 2s});
  REQUIRE(tight);
  CHECK(tight->handoff_deadline == tight->lease());

  auto o = valid();
  o.handoff_deadline = 0s;
  CHECK_THAT(rejection(o), Catch::Contains("handoff_deadline must be > 0, got 0s"));
  o.handoff_deadline = 541s;
  CHECK_THAT(rejection(o), Catch::Contains("handoff_deadline (541s) must be <= stale_threshold - safety_margin (540s)"));
  o.handoff_deadline = 540s;
  CHECK(validate(o));
}
