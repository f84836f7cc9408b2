// Built by check.sh against an installed pgmutex, through CMake and pkg-config.
#include <pgmutex/testing/simulation.hpp>

int main() {
  pgmutex::testing::Simulation sim;
  auto mutex = sim.instance(pgmutex::Options{.lock_name = "installed", .instance_id = "a"});
  mutex.create_schema();
  auto guard = mutex.try_acquire();
  return guard && guard.fence() == 1 ? 0 : 1;
}
