// The I/O pool when a thread cannot be created (std::thread throws: no
// threads or no memory left), through the test seam that makes every thread
// creation fail while set. Real threads and real time.
//
// Each case must start with no thread in the pool, so meson runs each one in
// a process of its own (tests/unit/meson.build): idle threads live 30 s.
#include "io_pool.hpp"

#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/memory_backend.hpp"
#include "pgmutex/testing/recording_metrics.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <functional>
#include <optional>
#include <stop_token>
#include <system_error>
#include <thread>

using namespace pgmutex;
using namespace pgmutex::testing;
using namespace std::chrono_literals;

namespace {

using RealMutex = BasicMutex<MemoryBackend, SteadyClock, RecordingMetrics>;

// Lease 1 s, heartbeats every 100 ms.
Options real_options() {
  return Options{.lock_name = "job", .instance_id = "a", .heartbeat_interval = 100ms, .alert_threshold = 500ms,
                 .stale_threshold = 2s, .safety_margin = 1s, .heartbeat_timeout = 1s};
}

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit = 5000ms) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return done();
}

// Thread creation fails from construction to destruction (or heal()).
struct NoThreads {
  NoThreads() { detail::testing::fail_thread_creation(true); }
  ~NoThreads() { heal(); }
  void heal() { detail::testing::fail_thread_creation(false); }
};

// Runs a task through the pool and waits for it: the pool has a thread again.
void post_and_wait() {
  std::atomic<bool> ran{false};
  ThreadExecutor{}.post([&] { ran = true; });
  REQUIRE(eventually([&] { return ran.load(); }));
}

}  // namespace

TEST_CASE("a post that finds no thread runs its task exactly once or throws and never runs it", "[io_pool]") {
  std::atomic<int> runs{0};
  bool threw = false;
  NoThreads no_threads;
  try {
    ThreadExecutor{}.post([&] { ++runs; });
  } catch (const std::system_error&) {
    threw = true;
  }
  std::this_thread::sleep_for(50ms);
  CHECK(runs == 0);  // no thread to run it on
  no_threads.heal();
  if (threw) {
    post_and_wait();  // a thread now: a task that was refused must still not run
    std::this_thread::sleep_for(200ms);
    CHECK(runs == 0);
  } else {
    // Nothing else posts: the pool itself tries again.
    CHECK(eventually([&] { return runs == 1; }));
    std::this_thread::sleep_for(200ms);
    CHECK(runs == 1);
  }
}

// A real-time mutex over the in-memory server, holding its lock.
struct Holder {
  RecordingMetrics record;
  std::optional<RealMutex> a;
  RealMutex::guard_type guard;
  Holder() {
    a.emplace(MemoryBackend(MemoryServer::create(), "a"), real_options(), RealMutex::clock_type{}, record);
    a->create_schema();
    guard = a->try_acquire();
    REQUIRE(guard);
  }
};

TEST_CASE("a lost lease is announced when its notification found no thread to run on", "[io_pool][mutex]") {
  Holder h;
  RecordingMetrics& record = h.record;
  std::optional<RealMutex>& a = h.a;
  RealMutex::guard_type& guard = h.guard;
  std::atomic<bool> stopped{false};
  std::stop_callback on_stop(guard.stop_token(), [&] { stopped = true; });

  NoThreads no_threads;  // no beat goes out: the lease ends 1 s after the acquire
  REQUIRE(eventually([&] { return guard.lost(); }));
  std::this_thread::sleep_for(300ms);  // the notification is posted; still no thread
  CHECK_FALSE(stopped);
  no_threads.heal();

  // Delivered without any further post of ours: the pool tries again.
  CHECK(eventually([&] { return stopped.load(); }));
  CHECK(eventually([&] { return record.count("lost") == 1; }));
  guard = {};
  a.reset();
  post_and_wait();
  std::this_thread::sleep_for(200ms);  // every task queued for the mutex has run (ASan: nothing freed twice)
  CHECK(record.count("lost") == 1);
}

TEST_CASE("a mutex destroyed while its posted beats wait for a thread", "[io_pool][mutex]") {
  Holder h;
  std::optional<RealMutex>& a = h.a;
  RealMutex::guard_type& guard = h.guard;

  NoThreads no_threads;
  std::this_thread::sleep_for(350ms);  // beats are due, and posted, but no thread runs them
  CHECK_FALSE(guard.lost());
  guard = {};
  a.reset();  // the state must outlive the beats still queued
  no_threads.heal();
  post_and_wait();
  std::this_thread::sleep_for(300ms);  // under ASan, a state freed early is read here
  SUCCEED("no use after free");
}
