// Reaching Postgres: which DSN, and a connected backend or a clean exit.
#pragma once

#include <string>

#include "arguments.hpp"
#include "pgmutex/postgres_backend.hpp"

namespace pgmutex::cli {

// A connected backend. Throws Exit: usage (64) for a malformed DSN,
// unavailable (69) when the server cannot be reached or refuses us.
[[nodiscard]] PostgresBackend connect_backend(const ConnectionArgs& args);

// Where we connect, fit for messages: the DSN with its password masked, or
// a note that libpq's environment decides.
[[nodiscard]] std::string describe_target(const PostgresBackend& backend, const ConnectionArgs& args);

}  // namespace pgmutex::cli
