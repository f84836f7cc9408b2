// Reaching Postgres: a connected backend, or a clean exit that says why.
#pragma once

#include <chrono>
#include <optional>

#include "arguments.hpp"
#include "pgmutex/postgres_backend.hpp"

namespace pgmutex::cli {

// A connected backend. Throws Exit with the class's code (exit_codes.hpp):
// usage (64) for a DSN the backend calls invalid, no_permission (77) when the
// server refuses the login, config (78) when the database does not exist,
// unavailable (69) when the server cannot be reached. The backend's message
// names the DSN with its password masked.
[[nodiscard]] PostgresBackend connect_backend(const ConnectionArgs& args, PostgresOptions options = {});

// As connect_backend, but a server that cannot be reached yet (a failover in
// progress: no host takes writes for a while) is tried again every half
// second until `deadline` (none: until it answers), as a wait for the lock
// would wait. Other refusals exit at once.
[[nodiscard]] PostgresBackend connect_backend_waiting(const ConnectionArgs& args, PostgresOptions options,
                                                      std::optional<std::chrono::steady_clock::time_point> deadline);

}  // namespace pgmutex::cli
