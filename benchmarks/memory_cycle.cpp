// The cost of the lock machinery itself: a try-acquire plus release cycle
// through BasicMutex on MemoryBackend (no network), next to std::mutex; with
// a metrics sink whose hooks do nothing next to NoMetrics; and through
// AnyMutex next to the direct one (the cost of the type erasure).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <mutex>
#include <thread>

#include "pgmutex/any_mutex.hpp"
#include "pgmutex/testing/simulation.hpp"

using namespace pgmutex;
using namespace pgmutex::testing;

namespace {

// Every hook present, each doing nothing: must cost what NoMetrics costs.
struct NoopMetrics {
  void acquired(std::string_view, std::string_view, Fence) noexcept {}
  void released(std::string_view, std::string_view) noexcept {}
  void contended(std::string_view, std::string_view) noexcept {}
  void stale_reclaimed(std::string_view, std::string_view, std::string_view) noexcept {}
  void alert(std::string_view, std::string_view, double) noexcept {}
  void heartbeat_latency(std::string_view, std::string_view, double) noexcept {}
  void lost(std::string_view, std::string_view, const Error&) noexcept {}
  void heartbeat_failed(std::string_view, std::string_view, const Error&) noexcept {}
};

void std_mutex_lock_unlock(benchmark::State& state) {
  std::mutex m;
  for (auto _ : state) {
    m.lock();
    benchmark::DoNotOptimize(&m);
    m.unlock();
  }
}
BENCHMARK(std_mutex_lock_unlock);

// One try_acquire() + release() per iteration, through any mutex type.
template <class Mutex>
void cycle(benchmark::State& state, Mutex& mutex) {
  mutex.create_schema();
  for (auto _ : state) {
    auto guard = mutex.try_acquire(nothrow);
    if (!guard || !*guard) state.SkipWithError("not acquired");
    benchmark::DoNotOptimize(guard->fence());
    if (!guard->release(nothrow)) state.SkipWithError("not released");
  }
}
template <class M>
void try_acquire_release(benchmark::State& state) {
  Simulation sim;
  auto mutex = sim.instance(Options{.lock_name = "bench", .instance_id = "a"}, M{});
  cycle(state, mutex);
}
BENCHMARK(try_acquire_release<NoMetrics>)->Name("memory_try_acquire_release/NoMetrics");
BENCHMARK(try_acquire_release<NoopMetrics>)->Name("memory_try_acquire_release/NoopMetrics");

// The same cycle through AnyMutex: a virtual call per operation, the guard
// moved into an AnyGuard and released through its table of functions.
void any_mutex_try_acquire_release(benchmark::State& state) {
  Simulation sim;
  AnyMutex mutex = sim.instance(Options{.lock_name = "bench", .instance_id = "a"});
  cycle(state, mutex);
}
BENCHMARK(any_mutex_try_acquire_release)->Name("memory_try_acquire_release/AnyMutex");

// A losing try: the path every waiting instance takes once per poll.
void losing_try(benchmark::State& state) {
  Simulation sim;
  auto holder = sim.instance(Options{.lock_name = "bench", .instance_id = "a"});
  auto waiter = sim.instance(Options{.lock_name = "bench", .instance_id = "b"});
  holder.create_schema();
  auto held = holder.try_acquire();
  for (auto _ : state) {
    auto guard = waiter.try_acquire(nothrow);
    if (!guard || *guard) state.SkipWithError("unexpected");
    benchmark::DoNotOptimize(guard);
  }
}
BENCHMARK(losing_try)->Name("memory_losing_try");

}  // namespace

// PGMUTEX_BENCH_THREADED=1: start (and join) a thread first. glibc's mutex and
// ours both skip atomic instructions while a process has only ever had one
// thread; this measures both sides as a multi-threaded service would run them.
int main(int argc, char** argv) {
  if (const char* threaded = std::getenv("PGMUTEX_BENCH_THREADED"); threaded != nullptr && *threaded == '1')
    std::thread([] {}).join();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
