// The seed's quickstart, in C++: run the nightly report on exactly one instance.
// Usage: quickstart [DSN]   (no DSN: libpq's PG* environment and .pgpass)
#include <cstdio>
#include <string>

#include "pgmutex/mutex.hpp"

using namespace std::chrono_literals;

void run_the_job(pgmutex::Fence fence, std::stop_token lost) {
  // Hand `fence` to whatever the job writes to, and stop if `lost` is requested.
  std::printf("running the job with fence %lld%s\n", static_cast<long long>(fence),
              lost.stop_requested() ? " (lease lost!)" : "");
}

int main(int argc, char** argv) {
  pgmutex::Mutex mutex(pgmutex::PostgresBackend(argc > 1 ? argv[1] : ""),
                       pgmutex::Options{.lock_name = "nightly-report-job"});
  mutex.create_schema();  // creates the mutex_lock table if it doesn't exist; idempotent

  // One try: the guard is false if another instance holds the lock.
  if (auto guard = mutex.try_acquire()) {
    run_the_job(guard.fence(), guard.stop_token());
  } else if (guard.holder()) {
    std::printf("another instance is running the job: %s\n", guard.holder()->instance_id.c_str());
  }  // released here

  // Or wait up to 30 s for it.
  if (auto guard = mutex.acquire(30s)) run_the_job(guard.fence(), guard.stop_token());

  // Or skip the `if` with singleton: runs only if the lock is acquired.
  auto report = mutex.singleton([](std::stop_token lost) { return lost.stop_requested() ? 1 : 0; });
  if (std::optional<int> status = report()) std::printf("report finished with status %d\n", *status);

  // Every operation also has a form that returns tl::expected instead of throwing.
  auto attempt = mutex.try_acquire(pgmutex::nothrow);
  if (!attempt) {
    std::fprintf(stderr, "could not reach the lock table: %s\n", attempt.error().message().c_str());
    return 1;
  }
  return *attempt ? 0 : 1;
}
