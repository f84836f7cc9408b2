// How to test your own code that uses pgmutex, without a database and without
// waiting: write it against any BasicMutex, and give it a SimMutex in tests.
#include <cstdio>
#include <cstdlib>

#include "pgmutex/testing/simulation.hpp"

using namespace std::chrono_literals;

// Your code: a scheduler that runs the report if this instance gets the lock.
template <class Mutex>
class ReportScheduler {
 public:
  explicit ReportScheduler(Mutex& mutex) : mutex_(mutex) {}
  bool tick() {
    auto ran = mutex_.singleton([this](std::stop_token) { ++reports_; });
    return ran();
  }
  [[nodiscard]] int reports() const { return reports_; }

 private:
  Mutex& mutex_;
  int reports_ = 0;
};

// Like assert, but also in release builds: an example that cannot fail proves nothing.
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "check failed: %s\n", what);
    std::exit(1);
  }
}

int main() {
  pgmutex::testing::Simulation sim;
  auto a = sim.instance(pgmutex::Options{.lock_name = "report", .instance_id = "a"});
  auto b = sim.instance(pgmutex::Options{.lock_name = "report", .instance_id = "b"});
  a.create_schema();
  ReportScheduler<pgmutex::testing::SimMutex> scheduler_b(b);

  // While a holds the lock, b's scheduler does not run the report...
  auto held_by_a = a.try_acquire();
  check(!scheduler_b.tick(), "!scheduler_b.tick()");

  // ...not even 9 minutes after a crashed (virtual time: this takes microseconds)...
  sim.server().partition("a");
  sim.advance(9min);
  check(!scheduler_b.tick(), "!scheduler_b.tick()");

  // ...but once a's row is stale (600 s without a heartbeat), b takes over.
  sim.advance(2min);
  check(scheduler_b.tick(), "scheduler_b.tick()");
  check(scheduler_b.reports() == 1, "scheduler_b.reports() == 1");
  check(held_by_a.lost(), "held_by_a.lost()");
  std::puts("ReportScheduler behaves: no report while a holds the lock, one after a's crash");
  return 0;
}
