#include "connection.hpp"

#include <string>

#include "exit_codes.hpp"

namespace pgmutex::cli {

PostgresBackend connect_backend(const ConnectionArgs& args, PostgresOptions options) {
  PostgresBackend backend(args.dsn, options);
  if (auto connected = backend.connect(); !connected) {
    const Error& error = connected.error();
    const int code = error == Errc::invalid_argument ? exit_code::usage : exit_code::unavailable;
    const std::string source = args.dsn.empty() ? " (no --dsn or PGMUTEX_DSN: libpq's PG* environment)" : "";
    // libpq's hints come on further lines: keep the report on one line.
    std::string message = error.message();
    for (char& c : message)
      if (c == '\n' || c == '\t') c = ' ';
    throw Exit(code, "cannot connect to Postgres" + source + ": " + message);
  }
  return backend;
}

}  // namespace pgmutex::cli
