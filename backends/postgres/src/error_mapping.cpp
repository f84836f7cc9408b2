// Maps a StatementFailure to a pgmutex Error (error_mapping.hpp): by kind,
// then SQLSTATE, with what to do about it and no secret in its text.
#include "error_mapping.hpp"

#include <exception>
#include <new>

#include <pqxx/pqxx>

#include "dsn.hpp"

namespace pgmutex::postgres_detail {
namespace {

bool is_connection_state(std::string_view state) {
  return state.starts_with("08") || state == "57P01" || state == "57P02" || state == "57P03" || state == "53300";
}

// Postgres quotes the statement after the message ("\nLINE 1: ...\n   ^"):
// our own SQL, noise to a user, and a hint appended after it would read as
// part of the quote.
std::string without_statement(std::string text) {
  if (const auto quote = text.find("\nLINE "); quote != std::string::npos) text.resize(quote);
  return text;
}

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  return text;
}

}  // namespace

bool connection_gone(const StatementFailure& failure) noexcept {
  return failure.kind == StatementFailure::Kind::timeout || failure.kind == StatementFailure::Kind::connection_lost ||
         (failure.kind == StatementFailure::Kind::server && (is_connection_state(failure.sqlstate) || failure.on_standby));
}

bool may_retry(const StatementFailure& failure, Effect effect) noexcept {
  if (failure.kind == StatementFailure::Kind::timeout) return false;  // its time is up
  if (!connection_gone(failure)) return false;
  if (effect != Effect::write) return true;
  // The server said it ended the session: the statement did not run.
  return !failure.sent || failure.kind == StatementFailure::Kind::server;
}

Error to_error(const StatementFailure& failure, std::string_view what, Effect effect,
               const std::vector<std::string>& secrets) {
  const auto describe = [&](const std::string& detail) {
    return std::string(what) + ": " + scrub(trimmed(detail), secrets);
  };
  using Kind = StatementFailure::Kind;
  switch (failure.kind) {
    case Kind::timeout:
    case Kind::connection_lost: {
      const bool unknown = effect == Effect::write && failure.sent;
      const std::string cause = failure.kind == Kind::timeout ? failure.message : "connection lost: " + failure.message;
      if (unknown) return Error(Errc::outcome_unknown, describe(cause + " (the write may have been applied)"));
      return Error(Errc::backend_unavailable, describe(cause));
    }
    case Kind::client:
      return Error(Errc::backend_error, describe(failure.message));
    case Kind::server:
      break;
  }
  const std::string& state = failure.sqlstate;
  const std::string cause = "SQLSTATE " + state + ": " + trimmed(without_statement(failure.message));
  // The server said why the statement failed, so it was not applied.
  if (is_connection_state(state)) return Error(Errc::backend_unavailable, describe(cause));
  // Not transient: retrying cannot help, so each gets its own code and the fix.
  if (state == "42P01")
    return Error(Errc::schema_missing, describe(cause + " (the lock table or its queue does not exist: call create_schema() first, or "
                                                        "run pgmutex schema, which creates or upgrades both)"));
  if (state == "42703")
    return Error(Errc::schema_missing, describe(cause + " (the lock table lacks a column, e.g. one made by the seed's "
                                                        "package or an older version: call create_schema() to upgrade it)"));
  if (state == "3D000") return Error(Errc::schema_missing, describe(cause));
  if (state == "42501") {
    if (!failure.hint.empty()) return Error(Errc::permission_denied, describe(cause + " (" + failure.hint + ")"));
    return Error(Errc::permission_denied,
                 describe(cause + " (the role needs SELECT, INSERT, UPDATE, DELETE on the lock table and its queue "
                                  "table, and USAGE on its fence sequence; create_schema() needs CREATE on the schema)"));
  }
  // A named prepared statement vanished between two statements, or another
  // client's is in the way: a pooler in transaction pooling hands each
  // transaction to another server connection.
  if (state == "26000" || state == "42P05")
    return Error(Errc::backend_error,
                 describe(cause + " (prepared statements do not last from one statement to the next here: a pooler "
                                  "in transaction pooling, e.g. pgbouncer's pool_mode=transaction, is in front of the "
                                  "server; use unnamed statements and polling instead: PostgresOptions::statement_mode "
                                  "= StatementMode::unnamed or automatic, pgmutex --statement-mode unnamed)"));
  if (state.starts_with("28"))
    return Error(Errc::permission_denied, describe(cause + " (authentication failed: check the user and password)"));
  // On a standby, the primary is elsewhere or coming: transient, as an
  // unreachable server is (a wait goes on, and reconnects); a primary whose
  // setting makes it read-only is not.
  if (state == "25006")
    return Error(failure.on_standby ? Errc::backend_unavailable : Errc::backend_error,
                 describe(cause + " (" +
                          (failure.hint.empty() ? std::string("the transaction is read-only: a standby (connect to the "
                                                              "primary, e.g. target_session_attrs=read-write), or "
                                                              "default_transaction_read_only = on for the role or "
                                                              "database")
                                                : failure.hint) +
                          ")"));
  // The schema named in the table's name does not exist (3F000).
  if (state == "3F000")
    return Error(Errc::schema_missing,
                 describe(cause + " (the lock table's schema does not exist: create it with CREATE SCHEMA as a role "
                                  "that may, then call create_schema())"));
  // Serialization, deadlock, lock_timeout (55P03), statement_timeout or cancel (57014): try again later.
  if (state == "40001" || state == "40P01" || state == "55P03" || state == "57014")
    return Error(Errc::backend_unavailable, describe(cause));
  if (state.starts_with("22")) return Error(Errc::invalid_argument, describe(cause));
  return Error(Errc::backend_error, describe(cause));
}

StatementFailure failure_from_current_exception() noexcept {
  using Kind = StatementFailure::Kind;
  try {
    try {
      throw;
    } catch (const pqxx::in_doubt_error& e) {
      return {Kind::connection_lost, {}, std::string("commit outcome unknown: ") + e.what(), true};
    } catch (const pqxx::broken_connection& e) {
      return {Kind::connection_lost, {}, e.what(), true};
    } catch (const pqxx::sql_error& e) {
      return {Kind::server, e.sqlstate(), e.what(), true};
    } catch (const std::bad_alloc&) {
      return {Kind::client, {}, "out of memory", false};
    } catch (const std::exception& e) {
      return {Kind::client, {}, e.what(), false};
    } catch (...) {
      return {Kind::client, {}, "unknown exception", false};
    }
  } catch (...) {  // building the message itself failed
    return {};
  }
}

}  // namespace pgmutex::postgres_detail
