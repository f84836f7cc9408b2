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
