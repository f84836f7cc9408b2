// The C++ snippets of README.md and the documentation site (docs/) that no
// other example holds, verbatim, each in a function of its own with the few
// names it assumes defined here: no page shows code that does not build.
// tests/readme_snippets.py checks that each snippet is here or in another example.
// This program is only compiled: its snippets talk to made-up hosts.
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>

#include <pgmutex/any_mutex.hpp>
#include <pgmutex/mutex.hpp>
#include <pgmutex/postgres_pool.hpp>

using namespace std::chrono_literals;

namespace {

// The names the snippets assume.
void run_the_job(pgmutex::Fence, std::stop_token = {}) {}
int report(int day, std::stop_token) { return day; }
void report_error(const std::string& text) { std::fputs(text.c_str(), stderr); }

void two_forms(pgmutex::Mutex& mutex) {
  auto guard = mutex.try_acquire();                      // throws on backend errors
  auto result = mutex.try_acquire(pgmutex::nothrow);     // Result<Guard>
  if (!result) report_error(result.error().message());   // "backend unavailable: lock 'job': …"
  else if (*result) run_the_job(result->fence());
}

void singleton_with_arguments(pgmutex::Mutex& mutex) {
  auto nightly = mutex.singleton([](std::stop_token lost, int day) { return report(day, lost); },
                                 {.blocking = true, .timeout = 1min});
  auto result = nightly(29);
  (void)result;
}

void with_metrics(pgmutex::PostgresBackend backend, pgmutex::Options options) {
  struct MyMetrics {
    void acquired(std::string_view lock_name, std::string_view instance_id, pgmutex::Fence fence) {}
    void released(std::string_view lock_name, std::string_view instance_id) {}
    void contended(std::string_view lock_name, std::string_view instance_id) {}
    void stale_reclaimed(std::string_view lock_name, std::string_view instance_id, std::string_view previous_holder) {}
    void alert(std::string_view lock_name, std::string_view holder, double seconds_since_heartbeat) {}
    void heartbeat_latency(std::string_view lock_name, std::string_view instance_id, double seconds) {}
    void acquire_latency(std::string_view lock_name, std::string_view instance_id, double seconds) {}
    void lost(std::string_view lock_name, std::string_view instance_id, const pgmutex::Error& reason) {}
    void heartbeat_failed(std::string_view lock_name, std::string_view instance_id, const pgmutex::Error& error) {}
    void lease_renewed(std::string_view lock_name, std::string_view instance_id, std::chrono::nanoseconds deadline) {}
  };
  pgmutex::BasicMutex<pgmutex::PostgresBackend, pgmutex::SteadyClock, MyMetrics> mutex(std::move(backend), options, {}, MyMetrics{});
}

void standard_locking(pgmutex::Mutex& reports, pgmutex::Mutex& invoices) {
  std::scoped_lock both(reports, invoices);        // std::lock's order: no deadlock between instances
  run_the_job(reports.lock_guard()->fence(), reports.lock_guard()->stop_token());
}

// The resource checks the fence: a pause between the check and the write is
// covered by it alone (README, "Failure modes, explicitly").
struct FencedStore {
  void write(pgmutex::Fence, const std::string&) {}
};
void fenced_write(pgmutex::Mutex::guard_type& guard, FencedStore& store, const std::string& data) {
  if (guard) store.write(guard.fence(), data);  // store: UPDATE ... WHERE last_fence <= $fence
}

// Compiled once: production passes a pgmutex::Mutex, tests a SimMutex.
void publish_nightly_report(pgmutex::AnyMutex& mutex) {
  if (auto guard = mutex.try_acquire()) run_the_job(guard.fence(), guard.stop_token());
}

void production() {
  pgmutex::AnyMutex mutex = pgmutex::Mutex(pgmutex::PostgresBackend(""), {.lock_name = "nightly-report-job"});
  publish_nightly_report(mutex);
}

// The snippets of "Testing your own code" are in testing_your_code.cpp, which runs.

// Any type with these two members is a pgmutex::ConnectionPool.
struct MyPool {
  pqxx::connection& borrow();                     // may throw: reported as backend_unavailable
  void give_back(pqxx::connection& c) noexcept;   // also gets dead connections: check c.is_open()
};

// A pool of one connection, enough to make the snippet link.
pqxx::connection& MyPool::borrow() {
  static pqxx::connection connection("");
  return connection;
}
void MyPool::give_back(pqxx::connection&) noexcept {}

void with_a_pool(MyPool& pool) {
  pgmutex::Mutex mutex(pgmutex::make_pooled_backend(pool), {.lock_name = "job"});  // `pool` must outlive the mutex
}

}  // namespace

int main(int argc, char**) {
  // Compiled, not run: reaching these would connect to the made-up hosts above.
  if (argc > 100) {
    pgmutex::Mutex mutex(pgmutex::PostgresBackend(""), pgmutex::Options{.lock_name = "job"});
    two_forms(mutex);
    singleton_with_arguments(mutex);
    with_metrics(pgmutex::PostgresBackend(""), pgmutex::Options{.lock_name = "job"});
    pgmutex::Mutex invoices(pgmutex::PostgresBackend(""), pgmutex::Options{.lock_name = "invoices"});
    standard_locking(mutex, invoices);
    auto guard = mutex.try_acquire();
    FencedStore store;
    fenced_write(guard, store, "report");
    production();
    MyPool pool;
    with_a_pool(pool);
  }
  return 0;
}
