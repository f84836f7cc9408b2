// Reaching Postgres (connection.hpp): a connected backend, or a clean exit that
// says why.
#include "connection.hpp"

#include <string>
#include <thread>

#include "exit_codes.hpp"

namespace pgmutex::cli {

namespace {

PostgresBackend backend_for(const ConnectionArgs& args, PostgresOptions options) {
  options.statement_mode = args.statement_mode == "prepared"  ? StatementMode::prepared
                           : args.statement_mode == "unnamed" ? StatementMode::unnamed
                                                              : StatementMode::automatic;
  return PostgresBackend(args.dsn, options);
}

[[noreturn]] void exit_not_connected(const Error& error, const ConnectionArgs& args) {
  const std::string source = args.dsn.empty() ? " (no --dsn or PGMUTEX_DSN: libpq's PG* environment)" : "";
  // Only an unreachable server is "cannot connect": a refusal says what was refused.
  exit_with(error, (error == Errc::backend_unavailable ? "cannot connect to Postgres" : "connecting to Postgres") + source,
            args);
}

}  // namespace

PostgresBackend connect_backend(const ConnectionArgs& args, PostgresOptions options) {
  // One try: a deadline that has already come.
  return connect_backend_waiting(args, std::move(options), std::chrono::steady_clock::now());
}

PostgresBackend connect_backend_waiting(const ConnectionArgs& args, PostgresOptions options,
                                        std::optional<std::chrono::steady_clock::time_point> deadline) {
  constexpr auto pause = std::chrono::milliseconds(500);
  PostgresBackend backend = backend_for(args, std::move(options));
  for (;;) {
    auto connected = backend.connect();
    if (connected) return backend;
    if (connected.error() != Errc::backend_unavailable ||
        (deadline && std::chrono::steady_clock::now() + pause >= *deadline))
      exit_not_connected(connected.error(), args);
    // An interrupt meanwhile ends the program (InterruptWatch): nothing is held.
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace pgmutex::cli
