#include "connection.hpp"

#include "exit_codes.hpp"

namespace pgmutex::cli {

PostgresBackend connect_backend(const ConnectionArgs& args) {
  PostgresBackend backend(args.dsn);
  if (auto connected = backend.connect(); !connected) {
    const Error& error = connected.error();
    const int code = error == Errc::invalid_argument ? exit_code::usage : exit_code::unavailable;
    throw Exit(code, "cannot connect to Postgres (" + describe_target(backend, args) + "): " + error.message());
  }
  return backend;
}

std::string describe_target(const PostgresBackend& backend, const ConnectionArgs& args) {
  if (args.dsn.empty()) return "DSN from the PG* environment";
  return "dsn '" + backend.redacted_dsn() + "'";
}

}  // namespace pgmutex::cli
