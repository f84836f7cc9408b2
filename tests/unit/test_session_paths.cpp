// The mutex over a backend that batches heartbeats and watches locks (as a
// pgmutex::Session does), in virtual time: the automatic heartbeat goes out
// through heartbeat_async and no executor thread waits for it; its answer,
// late or never, leaves the lease deadline where it was; a waiter sleeps until
// the backend says the lock may be free instead of polling.
#include "pgmutex/testing/simulation.hpp"

#include <catch2/catch.hpp>

#include <memory>
#include <vector>

using namespace pgmutex;
using namespace pgmutex::testing;
using namespace std::chrono_literals;

namespace {

// A MemoryBackend that answers heartbeats only when the test says (flush(),
// as a session's tick would), and whose waiters wake when a lock of theirs is
// released or their timeout passes, in virtual time.
class BatchingBackend {
 public:
  struct Shared {
    std::vector<std::pair<HolderKey, BeatCallback>> pending;
    std::vector<std::string> pending_names;  // the keys' views point here
    int sync_heartbeats = 0;
    int tries = 0;
    int releases = 0;
    bool flushing = false;
    bool refuse_beats = false;  // heartbeat_async says it cannot take one
    std::vector<WatchRequest> watches;
  };

  BatchingBackend(MemoryBackend inner, ManualExecutor executor, std::shared_ptr<Shared> shared)
      : inner_(std::move(inner)), executor_(std::move(executor)), shared_(std::move(shared)) {}

  Result<void> create_schema(std::string_view t) noexcept { return inner_.create_schema(t); }
  Result<AcquireResult> try_acquire(const AcquireRequest& r) noexcept {
    ++shared_->tries;
    return inner_.try_acquire(r);
  }
  Result<void> heartbeat(const HolderKey& k) noexcept {
    ++shared_->sync_heartbeats;
    return inner_.heartbeat(k);
  }
  Result<void> release(const HolderKey& k) noexcept {
    ++shared_->releases;
    return inner_.release(k);
  }
  Result<std::optional<LockRow>> inspect(LockRef l) noexcept { return inner_.inspect(l); }
  Result<std::vector<LockRow>> list(std::string_view t) noexcept { return inner_.list(t); }
  Result<std::optional<LockRow>> force_release(LockRef l) noexcept { return inner_.force_release(l); }

  bool heartbeat_async(const HolderKey& key, BeatCallback done) noexcept {
    if (shared_->refuse_beats) return false;
    HolderKey copy = key;  // the views into the mutex's options outlive the test's flushes
    shared_->pending.emplace_back(copy, std::move(done));
    return true;
  }

  Result<bool> wait_until_free(const WatchRequest& w, std::chrono::nanoseconds timeout, std::stop_token) noexcept {
    shared_->watches.push_back(w);
    const int before = shared_->releases;
    return executor_.wait_until(executor_.clock().now() + timeout, [&] { return shared_->releases != before; });
  }

  // Answers every pending heartbeat, as one batch would.
  void flush() {
    auto batch = std::move(shared_->pending);
    shared_->pending.clear();
    shared_->flushing = true;
    for (auto& [key, done] : batch) done(BeatReply{inner_.heartbeat(key), 0, 0});
    shared_->flushing = false;
  }

 private:
  MemoryBackend inner_;
  ManualExecutor executor_;
  std::shared_ptr<Shared> shared_;
};

static_assert(BackendBeatsAsynchronously<BatchingBackend>);
static_assert(BackendWatchesLocks<BatchingBackend>);

using BatchedMutex = BasicMutex<BatchingBackend, ManualClock, NoMetrics, ManualExecutor>;

struct World {
  ManualClock clock;
  ManualExecutor executor{clock};
  std::shared_ptr<MemoryServer> server = MemoryServer::create(executor);
  std::shared_ptr<BatchingBackend::Shared> shared = std::make_shared<BatchingBackend::Shared>();

  BatchingBackend backend(std::string connection) { return BatchingBackend(MemoryBackend(server, connection), executor, shared); }
  BatchedMutex mutex(std::string instance) {
    Options o{.lock_name = "job", .instance_id = instance, .heartbeat_interval = 10s, .alert_threshold = 30s,
              .stale_threshold = 60s, .safety_margin = 20s, .heartbeat_timeout = 20s};
    return BatchedMutex(backend(instance), std::move(o), clock, {}, executor);
  }
  // A heartbeat callback holds its mutex's state until it runs (exactly
  // once, by the contract): answer what is left, and run what that posts.
  ~World() {
    for (int round = 0; round < 3; ++round) {
      BatchingBackend(MemoryBackend(server, "end"), executor, shared).flush();
      executor.run_due();
    }
  }

  // Answers heartbeats as they come, as a session's ticks would.
  void run_for(std::chrono::nanoseconds d, bool answer = true) {
    const auto until = clock.now() + d;
    while (clock.now() < until) {
      executor.advance(1s);
      if (answer) BatchingBackend(MemoryBackend(server, "flush"), executor, shared).flush();
    }
  }
};

}  // namespace

TEST_CASE("the automatic heartbeat goes out through heartbeat_async and keeps the lease", "[session-paths]") {
  World w;
  BatchedMutex a = w.mutex("a");
  a.create_schema();
  auto guard = a.try_acquire();
  REQUIRE(guard);
  w.executor.advance(10s);
  CHECK(w.shared->pending.size() == 1);  // the beat waits for the batch: no thread holds it
  w.run_for(10min);
  CHECK(guard);
  CHECK_FALSE(guard.lost());
  CHECK(w.shared->sync_heartbeats == 0);  // never a blocking heartbeat
  auto row = a.inspect();
  REQUIRE(row);
  CHECK(row->seconds_since_heartbeat < 11.0);
}

TEST_CASE("an asynchronous heartbeat never answered leaves the lease deadline where it was", "[session-paths]") {
  World w;
  BatchedMutex a = w.mutex("a");
  a.create_schema();
  auto guard = a.try_acquire();  // lease 60 - 20 = 40 s
  REQUIRE(guard);
  double stopped_at = -1;
  std::stop_callback on_stop(guard.stop_token(),
                             [&] { stopped_at = std::chrono::duration<double>(w.clock.now().time_since_epoch()).count(); });
  w.run_for(45s, /*answer=*/false);
  CHECK(stopped_at == Approx(40.0));
  CHECK(guard.lost());
  // A late answer changes nothing.
  BatchingBackend(MemoryBackend(w.server, "late"), w.executor, w.shared).flush();
  w.executor.run_due();
  CHECK(guard.lost());
}

TEST_CASE("a lost row found by a batch is announced off the backend's thread", "[session-paths]") {
  World w;
  BatchedMutex a = w.mutex("a");
  a.create_schema();
  auto guard = a.try_acquire();
  REQUIRE(guard);
  bool stopped_inside_flush = false, stopped = false;
  std::stop_callback on_stop(guard.stop_token(), [&] {
    stopped = true;
    stopped_inside_flush = w.shared->flushing;
  });
  (void)w.backend("admin").force_release(LockRef{"mutex_lock", "job"});
  w.executor.advance(10s);
  BatchingBackend(MemoryBackend(w.server, "flush"), w.executor, w.shared).flush();
  CHECK_FALSE(stopped);  // the stop callback is the user's: posted, never run on the batch's thread
  w.executor.run_due();
  CHECK(stopped);
  CHECK_FALSE(stopped_inside_flush);
  CHECK(guard.lost());
}

TEST_CASE("a waiter on a watching backend sleeps until woken instead of polling", "[session-paths]") {
  World w;
  BatchedMutex holder = w.mutex("holder");
  BatchedMutex waiter = w.mutex("waiter");
  holder.create_schema();
  auto held = holder.try_acquire();
  REQUIRE(held);
  w.executor.advance(5s);
  BatchingBackend(MemoryBackend(w.server, "flush"), w.executor, w.shared).flush();
  // The holder releases 60 s from now; the waiter would poll 120 times at 500 ms.
  (void)w.executor.schedule_after(60s, [&] { held.release(); });
  const int tries_before = w.shared->tries;
  auto got = waiter.acquire(std::chrono::nanoseconds(120s));
  CHECK(got);
  CHECK(w.shared->tries - tries_before == 2);  // one refused, one after the release
  REQUIRE(w.shared->watches.size() == 1);
  CHECK(w.shared->watches[0].lock.lock_name == "job");
  CHECK(w.shared->watches[0].stale_threshold == 60s);
  REQUIRE(w.shared->watches[0].holder_stale_in);
  CHECK(*w.shared->watches[0].holder_stale_in <= 60s);
  CHECK(*w.shared->watches[0].holder_stale_in >= 50s);  // the holder's last heartbeat was at most 10 s old
}

TEST_CASE("a waiter on a watching backend still ends at its timeout", "[session-paths]") {
  World w;
  BatchedMutex holder = w.mutex("holder");
  BatchedMutex waiter = w.mutex("waiter");
  holder.create_schema();
  auto held = holder.try_acquire();
  REQUIRE(held);
  const auto start = w.clock.now();
  auto got = waiter.acquire(std::chrono::nanoseconds(30s));
  CHECK_FALSE(got);
  CHECK(got.why() == Errc::timeout);
  CHECK(w.clock.now() - start == 30s);
  CHECK(w.shared->tries <= 3);
}

TEST_CASE("a heartbeat the backend cannot take is tried again at the next wake-up", "[session-paths]") {
  World w;
  BatchedMutex a = w.mutex("a");
  a.create_schema();
  auto guard = a.try_acquire();  // lease 40 s
  REQUIRE(guard);
  w.shared->refuse_beats = true;
  w.executor.advance(15s);
  CHECK(w.shared->pending.empty());  // refused: nothing waits for an answer
  w.shared->refuse_beats = false;
  w.run_for(60s);  // past the first lease: only a beat taken after the refusal could keep it
  CHECK(guard);
  CHECK_FALSE(guard.lost());
  CHECK(w.shared->sync_heartbeats == 0);
}
