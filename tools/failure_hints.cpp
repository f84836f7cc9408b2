#include "failure_hints.hpp"

#include <cstdlib>

#include <libpq-fe.h>

#include "pgmutex/options.hpp"
#include "pgmutex/postgres_backend.hpp"

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

// An SQL identifier, quoted unless Postgres would read it unquoted as it is.
std::string sql_identifier(const std::string& name) {
  bool plain = !name.empty() && !(name[0] >= '0' && name[0] <= '9');
  for (char c : name) plain = plain && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
  if (plain) return name;
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  return out + "\"";
}

// The library quotes each part of a table name: "Jobs" is not jobs.
std::string sql_table(const std::string& table) {
  const auto dot = table.find('.');
  if (dot == std::string::npos) return sql_identifier(table);
  return sql_identifier(table.substr(0, dot)) + "." + sql_identifier(table.substr(dot + 1));
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

std::string lock_grants(const std::string& table, const std::string& role) {
  const std::string r = sql_identifier(role);
  return "GRANT SELECT, INSERT, UPDATE, DELETE ON " + sql_table(table) + " TO " + r + "; GRANT USAGE ON SEQUENCE " +
         sql_table(table + "_fence_seq") + " TO " + r;
}

std::string schema_grant(const std::string& table, const std::string& role) {
  const auto dot = table.find('.');
  const std::string schema = dot == std::string::npos ? "public" : sql_identifier(table.substr(0, dot));
  return "GRANT CREATE ON SCHEMA " + schema + " TO " + sql_identifier(role);
}

}  // namespace pgmutex::cli
