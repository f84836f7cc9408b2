// A lock holder in its own process, for the integration tests.
//
//   child hold TABLE LOCK INSTANCE        acquire (heartbeat 0.2s, stale 2s), print
//                                         "acquired FENCE", then hold until killed
//   child stress TABLE LOCK COUNT FILE    acquire and release COUNT times, writing
//                                         "FENCE START_NS END_NS" per hold to FILE
//   child watch TABLE LOCK INSTANCE KIND  KIND mutex or session: acquire as hold does, print
//                                         "acquired FENCE", then read the guard in a tight
//                                         loop; once it reads lost, print "lost LAST_HELD_NS
//                                         FIRST_LOST_NS CHECKS" (steady clock: CLOCK_MONOTONIC,
//                                         the same in every process) and exit 0
//   child queue TABLE LOCK INSTANCE HOLD_MS TIMEOUT_MS HANDOFF_MS
//                                         a blocking acquire (it queues): print "acquired
//                                         FENCE" (or "not-acquired"), hold HOLD_MS, release, exit
//
// Connection info comes from the PG* environment.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "pgmutex/mutex.hpp"
#include "pgmutex/session.hpp"

using namespace std::chrono_literals;

namespace {

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A holder's options: a beat every 200 ms, stale at 2 s.
pgmutex::Options holder_options(const std::string& table, const std::string& lock, const std::string& instance) {
  pgmutex::Options o;
  o.table = table;
  o.lock_name = lock;
  o.instance_id = instance;
  o.heartbeat_interval = 200ms;
  o.alert_threshold = 1s;
  o.stale_threshold = 2s;
  o.poll_interval = 50ms;
  return o;
}

int hold(const std::string& table, const std::string& lock, const std::string& instance) {
  pgmutex::Mutex mutex(pgmutex::PostgresBackend(""), holder_options(table, lock, instance));
  auto guard = mutex.acquire(10s);
  if (!guard) {
    std::cout << "not-acquired" << std::endl;
    return 1;
  }
  std::cout << "acquired " << guard.fence() << std::endl;
  for (;;) ::pause();
}

// Reads `guard` as fast as it can, as a job that checks before each write
// would, and reports the last read that said "held".
template <class Guard>
int watch_until_lost(Guard& guard) {
  std::cout << "acquired " << guard.fence() << std::endl;
  long long last_held = now_ns();
  long long checks = 0;
  for (;;) {
    ++checks;
    // The time is read before the guard: a stop that lands between the two
    // must not date a read made before it as after it.
    const long long at = now_ns();
    const bool held = static_cast<bool>(guard) && !guard.lost();
    if (!held) {
      std::cout << "lost " << last_held << " " << at << " " << checks << std::endl;
      return 0;
    }
    last_held = at;
  }
}

int watch(const std::string& table, const std::string& lock, const std::string& instance, const std::string& kind) {
  const pgmutex::Options o = holder_options(table, lock, instance);
  if (kind == "session") {
    auto session = pgmutex::Session::create("");
    pgmutex::SessionMutex mutex(session->backend(), o);
    auto guard = mutex.acquire(10s);
    if (!guard) return 1;
    return watch_until_lost(guard);
  }
  pgmutex::Mutex mutex(pgmutex::PostgresBackend(""), o);
  auto guard = mutex.acquire(10s);
  if (!guard) return 1;
  return watch_until_lost(guard);
}

int stress(const std::string& table, const std::string& lock, int count, const std::string& file) {
  pgmutex::Options o;
  o.table = table;
  o.lock_name = lock;
  o.heartbeat_interval = 5s;
  o.stale_threshold = 60s;
  o.poll_interval = 100ms;  // LISTEN/NOTIFY wakes waiters sooner
  pgmutex::Mutex mutex(pgmutex::PostgresBackend(""), o);
  std::vector<std::string> lines;
  lines.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    auto guard = mutex.acquire(60s);
    if (!guard) {
      std::cerr << "acquire " << i << " failed: timeout" << std::endl;
      return 1;
    }
    const long long start = now_ns();
    const long long end = now_ns();
    lines.push_back(std::to_string(guard.fence()) + " " + std::to_string(start) + " " + std::to_string(end));
    guard.release();
  }
  std::ofstream out(file);
  for (const std::string& line : lines) out << line << '\n';
  return out.good() ? 0 : 1;
}

}  // namespace

int queue(const std::string& table, const std::string& lock, const std::string& instance, int hold_ms,
          int timeout_ms, int handoff_ms, int stale_ms) {
  pgmutex::Options o = holder_options(table, lock, instance);
  o.handoff_deadline = std::chrono::milliseconds(handoff_ms);
  o.stale_threshold = std::chrono::milliseconds(stale_ms);
  // A waiter also looks at the holder's alert threshold: half the stale
  // one here (1 s with the default 2 s), so that a long threshold means no
  // early look that would stand in for the wake-up a test is about.
  o.alert_threshold = o.stale_threshold / 2;
  pgmutex::Mutex mutex(pgmutex::PostgresBackend(""), o);
  auto guard = mutex.acquire(std::chrono::milliseconds(timeout_ms));
  if (!guard) {
    std::cout << "not-acquired" << std::endl;
    return 1;
  }
  std::cout << "acquired " << guard.fence() << std::endl;
  std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  return guard.release(pgmutex::nothrow) ? 0 : 3;
}

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 4 && args[0] == "hold") return hold(args[1], args[2], args[3]);
    if (args.size() == 5 && args[0] == "stress") return stress(args[1], args[2], std::stoi(args[3]), args[4]);
    if (args.size() == 5 && args[0] == "watch") return watch(args[1], args[2], args[3], args[4]);
    if (args.size() == 8 && args[0] == "queue")
      return queue(args[1], args[2], args[3], std::stoi(args[4]), std::stoi(args[5]), std::stoi(args[6]),
                   std::stoi(args[7]));
  } catch (const std::exception& e) {
    std::cerr << "child: " << e.what() << std::endl;
    return 1;
  }
  std::cerr << "usage: child hold TABLE LOCK INSTANCE | child stress TABLE LOCK COUNT FILE" << std::endl;
  return 2;
}
