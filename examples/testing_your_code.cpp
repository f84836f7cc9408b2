// How to test your own code that uses pgmutex, without a database and without
// waiting: write it against pgmutex::AnyMutex&, compiled once; production
// hands it a pgmutex::Mutex (Postgres), its tests a SimMutex (virtual time).
#include <cstdio>
#include <cstdlib>

#include <pgmutex/any_mutex.hpp>
#include <pgmutex/testing/simulation.hpp>

using namespace std::chrono_literals;

// Your code: runs the report only on the instance that holds the lock.
// Production: pgmutex::AnyMutex mutex = pgmutex::Mutex(backend, options);
class ReportScheduler {
 public:
  explicit ReportScheduler(pgmutex::AnyMutex& mutex) : mutex_(mutex) {}

  bool tick() {
    auto guard = mutex_.try_acquire();
    if (!guard) return false;  // another instance holds the lock
    last_fence_ = guard.fence();  // hand it to what the report writes
    ++reports_;
    return true;
  }
  int reports() const { return reports_; }
  pgmutex::Fence last_fence() const { return last_fence_; }

 private:
  pgmutex::AnyMutex& mutex_;
  int reports_ = 0;
  pgmutex::Fence last_fence_ = 0;
};

// Stands for your test framework's assertion; unlike assert, it also checks
// in release builds: an example that cannot fail proves nothing.
void check(bool ok) {
  if (!ok) {
    std::fputs("check failed\n", stderr);
    std::exit(1);
  }
}

int main() {
  pgmutex::testing::Simulation sim;               // clock, executor, in-memory server
  pgmutex::AnyMutex a = sim.instance({.lock_name = "report", .instance_id = "a"});
  pgmutex::AnyMutex b = sim.instance({.lock_name = "report", .instance_id = "b"});
  a.create_schema();
  ReportScheduler scheduler_b(b);

  auto held = a.try_acquire();
  check(!scheduler_b.tick());                     // a holds the lock: b does not run the report
  sim.server().partition("a");                    // a crashes: its requests no longer arrive
  sim.advance(9min);                              // virtual time: heartbeats, watchdog, all in order
  check(!scheduler_b.tick());                     // a's row is not stale yet (600 s)
  sim.advance(2min);
  check(held.lost() && scheduler_b.tick());       // a's watchdog fired; b reclaimed the stale row
  check(scheduler_b.last_fence() > held.fence()); // a storage layer that checks fences rejects a

  // The same world by hand, as Simulation makes it: one virtual clock, an
  // executor on it, a server whose time the executor moves, and a mutex given
  // that clock and that executor.
  pgmutex::testing::ManualClock clock;
  pgmutex::testing::ManualExecutor executor(clock);
  auto server = pgmutex::MemoryServer::create(executor);
  pgmutex::testing::SimMutex c(pgmutex::MemoryBackend(server, "c"), {.lock_name = "report", .instance_id = "c"},
                               clock, {}, executor);
  c.create_schema();
  auto c_held = c.try_acquire();
  executor.advance(11min);                        // heartbeats keep c's lease: nothing is lost
  check(c_held && !c_held.lost());

  std::printf("ReportScheduler behaves: %d report, after a's crash, with fence %lld\n", scheduler_b.reports(),
              static_cast<long long>(scheduler_b.last_fence()));
  return 0;
}
