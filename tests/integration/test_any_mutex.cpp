// AnyMutex and the Lockable interface on a real server: the production half
// of "code written against AnyMutex& runs on Postgres and on SimMutex".
#include "pgmutex/any_mutex.hpp"

#include <mutex>

#include "support.hpp"

using namespace itest;
using pgmutex::AnyMutex;
using pgmutex::Errc;
using pgmutex::Mutex;
using pgmutex::PostgresBackend;

namespace {

// The same kind of function the unit tests run on SimMutex.
bool publish_if_leader(AnyMutex& mutex, std::vector<pgmutex::Fence>& published) {
  auto guard = mutex.try_acquire();
  if (!guard) return false;
  published.push_back(guard.fence());
  return true;
}

}  // namespace

TEST_CASE("AnyMutex runs on pgmutex::Mutex: both forms, its guard, and Lockable", "[any]") {
  const std::string table = fresh_table("any");
  AnyMutex a = Mutex(PostgresBackend(""), options(table, "job", "a"));
  AnyMutex b = Mutex(PostgresBackend(""), options(table, "job", "b"));
  a.create_schema();

  std::vector<pgmutex::Fence> published;
  CHECK(publish_if_leader(a, published));
  auto held = a.try_acquire(pgmutex::nothrow);
  REQUIRE(held);
  REQUIRE(*held);
  CHECK_FALSE(publish_if_leader(b, published));
  auto refused = b.try_acquire();
  CHECK(refused.why() == Errc::lock_held);
  REQUIRE(refused.holder());
  CHECK(refused.holder()->instance_id == "a");
  held->heartbeat();
  auto row = b.inspect();
  REQUIRE(row);
  CHECK(row->fence == held->fence());
  REQUIRE(held->release(pgmutex::nothrow));

  {
    std::unique_lock lock(b);  // lock(): acquire() with no timeout
    REQUIRE(b.lock_guard() != nullptr);
    CHECK(b.lock_guard()->fence() > held->fence());
    CHECK_FALSE(a.try_lock());
  }
  CHECK_FALSE(b.held());
  CHECK(publish_if_leader(b, published));
  CHECK(published.size() == 2);
  CHECK(published[1] > published[0]);
}

TEST_CASE("std::scoped_lock of two pgmutex::Mutex objects", "[any][lockable]") {
  const std::string table = fresh_table("scoped");
  Mutex reports(PostgresBackend(""), options(table, "reports", "a"));
  Mutex invoices(PostgresBackend(""), options(table, "invoices", "a"));
  Mutex rival(PostgresBackend(""), options(table, "invoices", "b"));
  reports.create_schema();
  {
    std::scoped_lock both(reports, invoices);
    CHECK(reports.held());
    CHECK(invoices.held());
    CHECK_FALSE(rival.try_lock());
  }
  CHECK(rival.try_lock());
  rival.unlock();
}
