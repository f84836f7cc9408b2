// Asks the server to cancel what a connection we gave up on is running.
// Private to the backend.
#pragma once

struct pg_conn;

namespace pgmutex::postgres_detail {

// Best effort and never blocks the caller: libpq 15's PQcancel has no timeout
// (against a frozen peer it waits as long as the peer stays frozen), so it runs
// on a detached thread, and at most a few run at once (beyond that, none is
// sent: the statement's own statement_timeout and lock_timeout still end it).
void cancel_in_background(pg_conn* connection) noexcept;

}  // namespace pgmutex::postgres_detail
