// Reading libpq's connection failures and results into Rows and
// StatementFailures, and parameters into libpq's form (pq_results.hpp).
#include "pq_results.hpp"

#include <algorithm>
#include <cstdlib>
#include <optional>

#include <libpq-fe.h>

namespace pgmutex::postgres_detail {
namespace {

bool is_sqlstate(std::string_view text) {
  return text.size() == 5 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z');
         });
}

}  // namespace

std::string trimmed(const char* text) {
  std::string out = text != nullptr ? text : "";
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ' || out.back() == '\r')) out.pop_back();
  return out;
}

StatementFailure connect_failure(PGconn* c) {
  if (PQconnectionNeedsPassword(c) != 0)
    // libpq gave up before the server could decide: the same class as a
    // wrong password (28000, invalid authorization), so never retried.
    return {StatementFailure::Kind::server, "28000",
            "the server asks for a password and none was given (password in the DSN, PGPASSWORD or ~/.pgpass)", false};
  std::string text = trimmed(PQerrorMessage(c));
  std::string state;
  for (std::size_t at = text.find(":  "); at != std::string::npos; at = text.find(":  ", at + 1)) {
    const std::size_t code = at + 3;
    if (code + 7 <= text.size() && is_sqlstate(std::string_view(text).substr(code, 5)) && text.compare(code + 5, 2, ": ") == 0) {
      state = text.substr(code, 5);
      text.erase(code, 7);
    }
  }
  // LOCATION lines name the server's source file: noise to a user.
  for (std::size_t at = text.find("\nLOCATION:"); at != std::string::npos; at = text.find("\nLOCATION:")) {
    const std::size_t end = text.find('\n', at + 1);
    text.erase(at, end == std::string::npos ? std::string::npos : end - at);
  }
  if (state.empty()) return {StatementFailure::Kind::connection_lost, {}, std::move(text), false};
  return {StatementFailure::Kind::server, std::move(state), std::move(text), false};
}

Rows rows_of(PGresult* result) {
  Rows rows;
  const int n = PQntuples(result);
  const int fields = PQnfields(result);
  rows.rows.resize(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto& row = rows.rows[static_cast<std::size_t>(r)];
    row.reserve(static_cast<std::size_t>(fields));
    for (int f = 0; f < fields; ++f) {
      if (PQgetisnull(result, r, f) != 0) row.emplace_back(std::nullopt);
      else row.emplace_back(std::string(PQgetvalue(result, r, f), static_cast<std::size_t>(PQgetlength(result, r, f))));
    }
  }
  rows.affected = std::strtol(PQcmdTuples(result), nullptr, 10);
  return rows;
}

StatementFailure failure_of(PGresult* result) {
  const char* state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
  return StatementFailure{state != nullptr ? StatementFailure::Kind::server : StatementFailure::Kind::connection_lost,
                          state != nullptr ? state : "", trimmed(PQresultErrorMessage(result)), true};
}

std::vector<const char*> values_of(const std::vector<std::string>& params) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const std::string& p : params) values.push_back(p.c_str());
  return values;
}

}  // namespace pgmutex::postgres_detail
