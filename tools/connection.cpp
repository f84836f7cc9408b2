#include "connection.hpp"

#include <string>

#include "exit_codes.hpp"

namespace pgmutex::cli {

PostgresBackend connect_backend(const ConnectionArgs& args, PostgresOptions options) {
  options.statement_mode = args.statement_mode == "prepared"  ? StatementMode::prepared
                           : args.statement_mode == "unnamed" ? StatementMode::unnamed
                                                              : StatementMode::automatic;
  PostgresBackend backend(args.dsn, options);
  if (auto connected = backend.connect(); !connected) {
    const Error& error = connected.error();
    const std::string source = args.dsn.empty() ? " (no --dsn or PGMUTEX_DSN: libpq's PG* environment)" : "";
    // Only an unreachable server is "cannot connect": a refusal says what was refused.
    exit_with(error, (error == Errc::backend_unavailable ? "cannot connect to Postgres" : "connecting to Postgres") + source,
              args);
  }
  return backend;
}

}  // namespace pgmutex::cli
