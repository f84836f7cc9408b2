// Exit codes per class of failure, and the exception that stops a command with
// one (exit_codes.hpp).
#include "exit_codes.hpp"

#include "failure_hints.hpp"
#include "pgmutex/table_name.hpp"

namespace pgmutex::cli {
namespace {

bool has_state(const Error& error, std::string_view state) {
  return error.detail.find("SQLSTATE " + std::string(state)) != std::string::npos;
}

// The fix, in the user's terms, for the classes that need one.
std::string fix_for(const Error& error, const std::string& what, const ConnectionArgs& connection) {
  if (error == Errc::schema_missing) {
    if (has_state(error, "3D000"))
      return "the database named by the connection does not exist: create it (createdb) or fix the DSN";
    if (has_state(error, "3F000")) {
      const auto name = parse_table_name(connection.table);
      const std::string schema = name ? sql_identifier(name->schema) : "SCHEMA";
      return "the schema " + schema + " does not exist: as a role that may, run CREATE SCHEMA " + schema +
             ", then: " + schema_command(connection);
    }
    return "the lock table " + connection.table + " is missing or lacks a column (made by the seed's package or an "
           "older pgmutex?): create or upgrade it with: " + schema_command(connection);
  }
  if (error == Errc::permission_denied) {
    if (!has_state(error, "42501"))
      return "authentication failed for role " + connection_role(connection) +
             ": check the user and password (DSN, PGPASSWORD or ~/.pgpass)";
    // The library's message already names the missing privilege and its GRANT.
    if (error.detail.find("GRANT ") != std::string::npos) return {};
    const std::string role = connection_role(connection);
    if (what == "schema")
      return "role " + role + " may not create the lock table: as an owner, run " + schema_grant(connection.table, role) +
             "; or have the owner run " + schema_command(connection);
    return "role " + role + " lacks a privilege on the lock table; as its owner, run: " +
           lock_grants(connection.table, role);
  }
  return {};
}

}  // namespace

int exit_code_for(const Error& error) noexcept {
  if (error.code.category() != error_category()) return exit_code::internal;
  switch (static_cast<Errc>(error.code.value())) {
    case Errc::invalid_argument: return exit_code::usage;
    case Errc::backend_unavailable:
    case Errc::outcome_unknown: return exit_code::unavailable;
    case Errc::lock_held:
    case Errc::timeout: return exit_code::temporary;
    case Errc::permission_denied: return exit_code::no_permission;
    case Errc::schema_missing: return exit_code::config;
    case Errc::backend_error: return exit_code::refused;
    // Never the outcome of a command's own request: a bug if it gets here.
    // (A lock lost while the command ran exits 70 from `run` itself.)
    case Errc::lock_not_held:
    case Errc::lease_lost:
    case Errc::cancelled:
    case Errc::already_acquired: return exit_code::internal;
  }
  return exit_code::internal;
}

// The library's own advice is in C++ terms (" (... call create_schema() ...)"
// at the end): where the command gives its own fix, only the server's words stay.
static std::string without_library_advice(std::string message) {
  if (message.ends_with(")"))
    if (const auto advice = message.rfind(" ("); advice != std::string::npos &&
                                                 message.find("create_schema()", advice) != std::string::npos)
      message.resize(advice);
  return message;
}

void exit_with(const Error& error, const std::string& what, const ConnectionArgs& connection) {
  const std::string fix = fix_for(error, what, connection);
  const std::string message = fix.empty() ? error.message() : without_library_advice(error.message());
  throw Exit(exit_code_for(error), what + ": " + message + (fix.empty() ? "" : " - " + fix));
}

}  // namespace pgmutex::cli
