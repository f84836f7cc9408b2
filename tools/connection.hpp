// Reaching Postgres: a connected backend, or a clean exit that says why.
#pragma once

#include <chrono>

#include "arguments.hpp"
#include "pgmutex/postgres_backend.hpp"

namespace pgmutex::cli {

// A connected backend. Throws Exit: usage (64) for a DSN the backend calls
// invalid, unavailable (69) when the server cannot be reached or refuses us.
// The backend's message names the DSN with its password masked.
// `network_timeout` bounds a statement stuck in the network (PostgresOptions).
[[nodiscard]] PostgresBackend connect_backend(const ConnectionArgs& args,
                                              std::chrono::nanoseconds network_timeout = std::chrono::seconds(10));

}  // namespace pgmutex::cli
