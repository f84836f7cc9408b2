// Built by check.sh against an installed pgmutex-postgres: the quickstart's
// link path. No server here: the mutex must report it cannot connect.
#include <pgmutex/mutex.hpp>

int main() {
  pgmutex::PostgresOptions quick;
  quick.reconnect_attempts = 1;
  pgmutex::Mutex mutex(pgmutex::PostgresBackend("host=/nonexistent-pgmutex-socket-dir", quick),
                       pgmutex::Options{.lock_name = "installed"});
  auto attempt = mutex.try_acquire(pgmutex::nothrow);
  return !attempt && attempt.error() == pgmutex::Errc::backend_unavailable ? 0 : 1;
}
