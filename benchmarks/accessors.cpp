// The guard's accessors while the lock's heartbeat statement hangs (the
// execution model's third rule): lost(), held(), fence() and stop_token()
// read the grant's bookkeeping and never wait for the statement. Each is
// measured with a heartbeat hung on its server (real threads, real time) and
// with none, in one run; the ratio should stay near 1.
#include <benchmark/benchmark.h>

#include <thread>

#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/memory_backend.hpp"

using namespace pgmutex;
using namespace std::chrono_literals;

namespace {

using RealMutex = BasicMutex<MemoryBackend>;  // SteadyClock, ThreadExecutor

// A held lock whose heartbeat, if `hung`, is stuck in its statement for the
// whole run (a 60 s statement timeout inside a 300 s margin).
struct Held {
  std::shared_ptr<MemoryServer> server = MemoryServer::create();
  RealMutex mutex{MemoryBackend(server, "x"),
                  Options{.lock_name = "x", .instance_id = "a", .heartbeat_interval = 10ms,
                          .alert_threshold = 1s, .stale_threshold = 600s, .safety_margin = 300s,
                          .heartbeat_timeout = 60s}};
  RealMutex::guard_type guard;

  explicit Held(bool hung) {
    mutex.create_schema();
    guard = mutex.try_acquire();
    if (!hung) return;
    server->hang("x");
    while (server->hanging() == 0) std::this_thread::sleep_for(1ms);  // the next beat is stuck
  }
  ~Held() { server->unhang("x"); }
};

template <class Read>
void accessor(benchmark::State& state, Read read) {
  Held held(state.range(0) == 1);
  for (auto _ : state) benchmark::DoNotOptimize(read(held));
  if (state.range(0) == 1 && held.server->hanging() == 0) state.SkipWithError("the heartbeat was not hung");
}

void lost(benchmark::State& s) { accessor(s, [](Held& h) { return h.guard.lost(); }); }
void held(benchmark::State& s) { accessor(s, [](Held& h) { return h.mutex.held(); }); }
void fence(benchmark::State& s) { accessor(s, [](Held& h) { return h.guard.fence(); }); }
void stop_token(benchmark::State& s) { accessor(s, [](Held& h) { return h.guard.stop_token().stop_requested(); }); }

// Arg 1: a heartbeat hangs; arg 0: none does.
BENCHMARK(lost)->Arg(1)->Arg(0);
BENCHMARK(held)->Arg(1)->Arg(0);
BENCHMARK(fence)->Arg(1)->Arg(0);
BENCHMARK(stop_token)->Arg(1)->Arg(0);

}  // namespace

BENCHMARK_MAIN();
