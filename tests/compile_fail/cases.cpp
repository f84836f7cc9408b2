// Misuses that must not compile, each with an error that names what is
// missing. check.sh compiles this file once per case (-DCASE_<name>) and
// checks the compiler's message; CASE_good must compile.
#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/testing/manual_clock.hpp"
#include "pgmutex/testing/manual_executor.hpp"

using namespace pgmutex;

// A complete backend, minus what a case removes.
template <bool WithHeartbeat>
struct SomeBackend {
  Result<void> create_schema(std::string_view) noexcept { return {}; }
  Result<AcquireResult> try_acquire(const AcquireRequest&) noexcept { return AcquireResult{}; }
  Result<void> heartbeat(const HolderKey&) noexcept
    requires WithHeartbeat
  {
    return {};
  }
  Result<void> release(const HolderKey&) noexcept { return {}; }
  Result<std::optional<LockRow>> inspect(LockRef) noexcept { return std::nullopt; }
  Result<std::vector<LockRow>> list(std::string_view) noexcept { return std::vector<LockRow>{}; }
  Result<std::optional<LockRow>> force_release(LockRef) noexcept { return std::nullopt; }
};

struct ClockWithoutNow {
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::steady_clock::time_point;
  time_point later() const { return {}; }
};

struct ExecutorWithoutScheduling {
  bool wait_for(std::chrono::nanoseconds, std::stop_token) { return false; }
};

struct MetricsWithWrongSignature {
  void acquired(int fence) { (void)fence; }  // should be (string_view, string_view, Fence)
};

struct MetricsGood {
  void acquired(std::string_view, std::string_view, Fence) noexcept {}
  void alert(std::string_view, std::string_view, double) {}
};

#if defined(CASE_good)
using Good = BasicMutex<SomeBackend<true>, testing::ManualClock, MetricsGood, testing::ManualExecutor>;
[[maybe_unused]] void use(Good& m) { (void)m.try_acquire(nothrow); }
static_assert(Backend<SomeBackend<true>>);
#elif defined(CASE_backend_without_heartbeat)
BasicMutex<SomeBackend<false>>* m = nullptr;
#elif defined(CASE_clock_without_now)
BasicMutex<SomeBackend<true>, ClockWithoutNow>* m = nullptr;
#elif defined(CASE_executor_without_scheduling)
BasicMutex<SomeBackend<true>, SteadyClock, NoMetrics, ExecutorWithoutScheduling>* m = nullptr;
#elif defined(CASE_metrics_with_wrong_signature)
BasicMutex<SomeBackend<true>, SteadyClock, MetricsWithWrongSignature>* m = nullptr;
#elif defined(CASE_any_mutex_from_lvalue)
#include "pgmutex/any_mutex.hpp"
[[maybe_unused]] void wrap(BasicMutex<SomeBackend<true>>& m) { AnyMutex any = m; }
#elif defined(CASE_asio_mutex_without_executor)
// Issue 20, friction 7: an AsioMutex needs its loop; leaving the executor out
// names the Executor policy and the fifth argument, not a brace-enclosed list.
#include "pgmutex/asio/executor.hpp"
#include "pgmutex/memory_backend.hpp"
[[maybe_unused]] void make(std::shared_ptr<MemoryServer> server) {
  BasicMutex<MemoryBackend, SteadyClock, NoMetrics, AsioExecutor> m{MemoryBackend(server), Options{.lock_name = "job"}};
}
#else
#error "define one CASE_<name>"
#endif

int main() {}
