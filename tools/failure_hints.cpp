// The fix for a database refusal that retrying cannot fix, as a command or SQL
// to paste (failure_hints.hpp).
#include "failure_hints.hpp"

#include <cstdlib>

#include <libpq-fe.h>

#include "pgmutex/options.hpp"
#include "pgmutex/postgres_backend.hpp"
#include "pgmutex/table_name.hpp"

namespace pgmutex::cli {
namespace {

std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') out += "'\\''";
    else out.push_back(c);
  }
  return out + "'";
}

bool dsn_given_as_flag(const ConnectionArgs& connection) {
  const char* from_environment = std::getenv("PGMUTEX_DSN");
  return !connection.dsn.empty() && (from_environment == nullptr || connection.dsn != from_environment);
}

std::string value_of(PQconninfoOption* options, std::string_view keyword) {
  for (PQconninfoOption* o = options; o != nullptr && o->keyword != nullptr; ++o)
    if (keyword == o->keyword && o->val != nullptr && *o->val != '\0') return o->val;
  return {};
}

}  // namespace

std::string schema_command(const ConnectionArgs& connection) {
  std::string command = "pgmutex schema";
  // The masking is the backend's own (constructing one does not connect).
  if (dsn_given_as_flag(connection)) command += " --dsn " + shell_quoted(PostgresBackend(connection.dsn).redacted_dsn());
  if (connection.table != Options{}.table) command += " --table " + shell_quoted(connection.table);
  return command;
}

std::string connection_role(const ConnectionArgs& connection) {
  std::string role;
  if (PQconninfoOption* given = PQconninfoParse(connection.dsn.c_str(), nullptr)) {
    role = value_of(given, "user");
    PQconninfoFree(given);
  }
  if (role.empty()) {
    if (PQconninfoOption* defaults = PQconndefaults()) {  // PGUSER, else the OS user
      role = value_of(defaults, "user");
      PQconninfoFree(defaults);
    }
  }
  return role.empty() ? "ROLE" : role;
}

// The names are the library's own: psql's rules, and the derived sequence.
std::string lock_grants(const std::string& table, const std::string& role) {
  const std::string r = sql_identifier(role);
  const auto name = parse_table_name(table);
  if (!name) return "GRANT SELECT, INSERT, UPDATE, DELETE ON <table> TO " + r;
  return "GRANT SELECT, INSERT, UPDATE, DELETE ON " + sql_name(*name) + " TO " + r + "; GRANT USAGE ON SEQUENCE " +
         sql_name(fence_sequence_of(*name)) + " TO " + r;
}

std::string schema_grant(const std::string& table, const std::string& role) {
  const auto name = parse_table_name(table);
  const std::string schema = !name || name->schema.empty() ? "public" : sql_identifier(name->schema);
  return "GRANT CREATE ON SCHEMA " + schema + " TO " + sql_identifier(role);
}

}  // namespace pgmutex::cli
