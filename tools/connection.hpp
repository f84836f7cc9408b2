// Reaching Postgres: a connected backend, or a clean exit that says why.
#pragma once

#include "arguments.hpp"
#include "pgmutex/postgres_backend.hpp"

namespace pgmutex::cli {

// A connected backend. Throws Exit: usage (64) for a DSN the backend calls
// invalid, unavailable (69) when the server cannot be reached or refuses us.
// The backend's message names the DSN with its password masked.
[[nodiscard]] PostgresBackend connect_backend(const ConnectionArgs& args, PostgresOptions options = {});

}  // namespace pgmutex::cli
