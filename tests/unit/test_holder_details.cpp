// The holder's details travel with its grant, in the in-memory backend as in Postgres.
#include <catch2/catch.hpp>

#include "pgmutex/memory_backend.hpp"

using namespace pgmutex;
using namespace std::chrono_literals;

TEST_CASE("MemoryBackend stores the holder details an acquire gives", "[memory][holder]") {
  MemoryBackend b(MemoryServer::create());
  REQUIRE(b.create_schema("t"));
  AcquireRequest given{LockRef{"t", "job"}, "me", 60s};
  given.holder_details = HolderDetails{"web-3", 4242, "sync --all"};
  REQUIRE(b.try_acquire(given));
  REQUIRE(b.try_acquire(AcquireRequest{LockRef{"t", "bare"}, "me", 60s}));

  auto row = b.inspect(LockRef{"t", "job"});
  REQUIRE(row);
  REQUIRE(row->has_value());
  CHECK((*row)->holder_host == "web-3");
  CHECK((*row)->holder_pid == 4242);
  CHECK((*row)->holder_command == "sync --all");
  auto bare = b.inspect(LockRef{"t", "bare"});
  REQUIRE(bare);
  REQUIRE(bare->has_value());
  CHECK((*bare)->holder_host.empty());  // the memory backend has no defaults
  CHECK((*bare)->holder_pid == 0);
}

// LockRef::identity lets the backend skip comparing names it has seen from
// the same mutex; another identity, or none, must still be compared by contents.
TEST_CASE("MemoryBackend compares names and holders by contents across identities", "[memory][holder]") {
  MemoryBackend b(MemoryServer::create());
  REQUIRE(b.create_schema("t"));
  const auto request = [](std::uint64_t identity, std::string_view lock, std::string_view instance, GrantToken token,
                          std::string_view host) {
    AcquireRequest r{LockRef{"t", lock, identity}, instance, 60s, token};
    r.holder_details = HolderDetails{host, 1, ""};
    return r;
  };
  const auto holder = [&](std::string_view lock) { return b.inspect(LockRef{"t", lock}).value().value(); };
  // Acquires (required to succeed) and returns the grant's fence.
  const auto granted = [&](std::uint64_t identity, std::string_view lock, std::string_view instance, GrantToken token,
                           std::string_view host) {
    auto result = b.try_acquire(request(identity, lock, instance, token, host));
    REQUIRE(result);
    REQUIRE(result->acquired);
    return result->fence;
  };

  const Fence a = granted(7, "job", "a", 1, "host-a");
  // Right fence and token, wrong instance, no identity: refused.
  CHECK(b.release(HolderKey{LockRef{"t", "job"}, "b", a, 1}).error() == Errc::lock_not_held);
  REQUIRE(b.release(HolderKey{LockRef{"t", "job", 7}, "a", a, 1}));

  // Another identity on the same row: its own instance and details are written.
  const Fence other = granted(8, "job", "b", 2, "host-b");
  CHECK(holder("job").instance_id == "b");
  CHECK(holder("job").holder_host == "host-b");
  // The first identity's key does not fit the second one's grant.
  CHECK(b.release(HolderKey{LockRef{"t", "job", 7}, "a", other, 2}).error() == Errc::lock_not_held);
  REQUIRE(b.release(HolderKey{LockRef{"t", "job", 8}, "b", other, 2}));

  // A lock between the two: the cache moves, and back.
  granted(9, "report", "c", 3, "host-c");
  CHECK(holder("report").instance_id == "c");
  // An identity seen before the cache moved must not be handed the cached row.
  const Fence back = granted(8, "job", "b", 6, "host-b");
  CHECK(holder("job").instance_id == "b");
  REQUIRE(b.release(HolderKey{LockRef{"t", "job", 8}, "b", back, 6}));

  // The first identity again, after the second: its strings are written back.
  const Fence again = granted(7, "job", "a", 4, "host-a");
  CHECK(holder("job").instance_id == "a");
  CHECK(holder("job").holder_host == "host-a");
  CHECK(holder("report").instance_id == "c");

  // No identity on either side: the instance is compared.
  REQUIRE(b.release(HolderKey{LockRef{"t", "job", 7}, "a", again, 4}));
  const Fence anonymous = granted(0, "job", "d", 5, "host-d");
  CHECK(holder("job").instance_id == "d");
  CHECK(b.release(HolderKey{LockRef{"t", "job"}, "a", anonymous, 5}).error() == Errc::lock_not_held);
  REQUIRE(b.release(HolderKey{LockRef{"t", "job"}, "d", anonymous, 5}));
}
