// Sends a cancel request for a connection we gave up on, off the caller's
// thread (pq_cancel.hpp).
#include "pq_cancel.hpp"

#include <atomic>
#include <thread>

#include <libpq-fe.h>

namespace pgmutex::postgres_detail {
namespace {
constexpr int max_cancels_in_flight = 4;
std::atomic<int> cancels_in_flight{0};
}  // namespace

void cancel_in_background(pg_conn* connection) noexcept {
  if (connection == nullptr || PQstatus(connection) != CONNECTION_OK) return;
  if (cancels_in_flight.fetch_add(1) >= max_cancels_in_flight) {
    cancels_in_flight.fetch_sub(1);
    return;
  }
  // PGcancel is a copy of what the request needs: it outlives the connection.
  PGcancel* cancel = PQgetCancel(connection);
  if (cancel == nullptr) {
    cancels_in_flight.fetch_sub(1);
    return;
  }
  try {
    std::thread([cancel] {
      char error[256];
      (void)PQcancel(cancel, error, sizeof error);
      PQfreeCancel(cancel);
      cancels_in_flight.fetch_sub(1);
    }).detach();
  } catch (...) {  // no thread: no cancel
    PQfreeCancel(cancel);
    cancels_in_flight.fetch_sub(1);
  }
}

}  // namespace pgmutex::postgres_detail
