// The cost of AnyMutex's erasure, counted rather than timed: one heap
// allocation to wrap a mutex, and none more per acquire/release cycle than
// the mutex it wraps makes.
#include "pgmutex/any_mutex.hpp"
#include "pgmutex/testing/simulation.hpp"

#include <catch2/catch.hpp>

#include "allocation_counter.hpp"

using namespace pgmutex;
using namespace pgmutex::testing;

namespace {

// Allocations made by `cycles` try_acquire + release cycles through `mutex`.
template <class Mutex>
long allocations_per_cycles(Mutex& mutex, int cycles) {
  const long before = pgmutex::test::allocations_on_this_thread();
  for (int i = 0; i < cycles; ++i) {
    auto guard = mutex.try_acquire(nothrow);
    if (!guard || !*guard || !guard->release(nothrow)) return -1;
  }
  return pgmutex::test::allocations_on_this_thread() - before;
}

}  // namespace

TEST_CASE("AnyMutex allocates once to wrap, and no more per cycle than the mutex it wraps", "[any][allocations]") {
  Simulation sim;
  SimMutex direct = sim.instance(Options{.lock_name = "direct", .instance_id = "a"});
  SimMutex to_wrap = sim.instance(Options{.lock_name = "erased", .instance_id = "a"});
  direct.create_schema();

  const long before_wrap = pgmutex::test::allocations_on_this_thread();
  AnyMutex any = std::move(to_wrap);
  CHECK(pgmutex::test::allocations_on_this_thread() - before_wrap == 1);

  // Warm up both (the in-memory table makes its row on the first grant), then count.
  REQUIRE(allocations_per_cycles(direct, 1) >= 0);
  REQUIRE(allocations_per_cycles(any, 1) >= 0);
  const long direct_cycles = allocations_per_cycles(direct, 100);
  const long any_cycles = allocations_per_cycles(any, 100);
  REQUIRE(direct_cycles >= 0);
  CHECK(any_cycles == direct_cycles);
}
