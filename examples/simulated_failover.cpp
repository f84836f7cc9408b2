// The story of a crashed lock holder, in virtual time on the in-memory
// backend: contention, a crash, the alert at 30 s, the reclaim at 600 s.
// Ten simulated minutes run in a few milliseconds.
#include <cstdio>
#include <string>

#include "pgmutex/testing/simulation.hpp"

using namespace pgmutex;
using namespace pgmutex::testing;
using namespace std::chrono_literals;

// Prints what the hooks see, stamped with virtual time.
struct Narrator {
  ManualClock clock;
  void say(const std::string& text) const {
    std::printf("[t=%6.1fs] %s\n", std::chrono::duration<double>(clock.now().time_since_epoch()).count(), text.c_str());
  }
  void acquired(std::string_view lock, std::string_view who, Fence fence) const {
    say(std::string(who) + " acquired '" + std::string(lock) + "' with fence " + std::to_string(fence));
  }
  void contended(std::string_view lock, std::string_view who) const {
    // Once a minute is enough to show the waiting.
    if (clock.now().time_since_epoch() % 60s == 0s)
      say(std::string(who) + " tried '" + std::string(lock) + "': held by another instance");
  }
  void alert(std::string_view, std::string_view holder, double seconds) const {
    say("ALERT: holder " + std::string(holder) + " sent no heartbeat for " + std::to_string(int(seconds)) +
        " s: slow, or dead? (on-call can look before anything is reclaimed)");
  }
  void stale_reclaimed(std::string_view, std::string_view who, std::string_view previous) const {
    say(std::string(who) + " reclaimed the stale lock from " + std::string(previous));
  }
  void lost(std::string_view, std::string_view who, const Error& reason) const {
    say(std::string(who) + "'s own watchdog declared its lease lost: " + reason.detail);
  }
};

int main() {
  Simulation sim;
  const Narrator narrator{sim.clock()};
  auto worker = [&](const char* name) {
    return sim.instance(Options{.lock_name = "nightly-report-job", .instance_id = name}, narrator);
  };
  auto a = worker("worker-a");
  auto b = worker("worker-b");
  a.create_schema();

  auto job = a.try_acquire();
  narrator.say("worker-a runs the nightly report");
  if (b.try_acquire()) return 1;  // must not happen: the lock is taken

  sim.advance(15s);
  narrator.say("worker-a crashes (its heartbeats stop reaching the database)");
  sim.server().partition("worker-a");

  Fence reclaimed_fence = 0;
  while (sim.now().time_since_epoch() < 15min) {
    sim.advance(15s);
    if (auto taken = b.try_acquire()) {
      reclaimed_fence = taken.fence();
      narrator.say("worker-b runs the job now; fence " + std::to_string(taken.fence()) + " > " +
                   std::to_string(job.fence()) + ", so a storage layer that checks fences rejects worker-a");
      break;
    }
  }
  sim.server().heal("worker-a");
  try {
    job.heartbeat();
  } catch (const LockNotHeldError& e) {
    narrator.say(std::string("worker-a comes back; its next heartbeat says: ") + e.what());
  }
  return reclaimed_fence > job.fence() && job.lost() ? 0 : 1;
}
