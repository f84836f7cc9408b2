// A simulated world for tests: one virtual clock, one deterministic executor,
// one in-memory server, and as many instances (mutexes) as the test needs.
// Ten minutes of lock life run in microseconds: time moves only via advance().
#pragma once

#include <string>
#include <utility>

#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/election.hpp"
#include "pgmutex/observer.hpp"
#include "pgmutex/memory_backend.hpp"
#include "pgmutex/testing/manual_clock.hpp"
#include "pgmutex/testing/manual_executor.hpp"

namespace pgmutex::testing {

template <Metrics M = NoMetrics>
using BasicSimMutex = BasicMutex<MemoryBackend, ManualClock, M, ManualExecutor>;
using SimMutex = BasicSimMutex<NoMetrics>;
using SimElection = BasicElection<MemoryBackend, ManualClock, NoMetrics, ManualExecutor>;
using SimObserver = BasicObserver<MemoryBackend, ManualClock, NoMetrics, ManualExecutor>;

class Simulation {
 public:
  Simulation() : executor_(clock_), server_(MemoryServer::create(executor_)) {}

  // An instance whose connection is named after its instance_id (for partition()).
  template <Metrics M = NoMetrics>
  BasicSimMutex<M> instance(Options options, M metrics = {}) {
    std::string connection = options.instance_id;
    return BasicSimMutex<M>(MemoryBackend(server_, std::move(connection)), std::move(options), clock_,
                            std::move(metrics), executor_);
  }

  // An instance whose client clock runs `clock_rate` times as fast as true
  // time (1.05: 5% fast), its timers too; the server keeps true time. Its
  // timers can be held back by pause(instance_id).
  template <Metrics M = NoMetrics>
  BasicSimMutex<M> instance(Options options, M metrics, double clock_rate) {
    std::string connection = options.instance_id;
    ManualExecutor own = executor_.drifting(clock_rate).in_group(connection);
    return BasicSimMutex<M>(MemoryBackend(server_, std::move(connection)), std::move(options),
                            clock_.drifting(clock_rate), std::move(metrics), std::move(own));
  }

  // A candidate (or a reader of who leads), on a connection named after its
  // instance_id, its timers pausable as the form above.
  SimElection election(Options options) {
    std::string connection = options.instance_id;
    ManualExecutor own = executor_.drifting(1.0).in_group(connection);
    return SimElection(MemoryBackend(server_, std::move(connection)), std::move(options), clock_, NoMetrics{},
                       std::move(own));
  }

  // An observer of an election, on a connection named after its instance_id
  // (partition() or drop_connection() it to make it miss changes). It reads
  // the leader every poll_interval of virtual time.
  SimObserver observer(Options options) {
    std::string connection = options.instance_id;
    return SimObserver(MemoryBackend(server_, std::move(connection)), std::move(options), clock_, NoMetrics{}, executor_);
  }

  // Holds back the timers and posted tasks of the instance made with
  // `instance_id` (by the form above that takes a clock rate) while time
  // goes on: its process is stopped (SIGSTOP), or its timer thread is not
  // scheduled. resume() lets them run, late, at the next advance or run_due().
  void pause(const std::string& instance_id) { executor_.pause(instance_id); }
  void resume(const std::string& instance_id) { executor_.resume(instance_id); }

  // A raw connection, to look at or change the table directly.
  [[nodiscard]] MemoryBackend connection(std::string name = "observer") const { return MemoryBackend(server_, std::move(name)); }

  void advance(std::chrono::nanoseconds d) { executor_.advance(d); }
  [[nodiscard]] ManualClock::time_point now() const { return clock_.now(); }
  [[nodiscard]] ManualClock& clock() noexcept { return clock_; }
  [[nodiscard]] ManualExecutor& executor() noexcept { return executor_; }
  [[nodiscard]] MemoryServer& server() noexcept { return *server_; }

 private:
  ManualClock clock_;
  ManualExecutor executor_;
  std::shared_ptr<MemoryServer> server_;
};

}  // namespace pgmutex::testing
