// Reaching Postgres: a connected backend, or a clean exit that says why.
#pragma once

#include "arguments.hpp"
#include "pgmutex/postgres_backend.hpp"

namespace pgmutex::cli {

// A connected backend. Throws Exit with the class's code (exit_codes.hpp):
// usage (64) for a DSN the backend calls invalid, no_permission (77) when the
// server refuses the login, config (78) when the database does not exist,
// unavailable (69) when the server cannot be reached. The backend's message
// names the DSN with its password masked.
[[nodiscard]] PostgresBackend connect_backend(const ConnectionArgs& args, PostgresOptions options = {});

}  // namespace pgmutex::cli
