// What the libpq engine (PqConnection) reads from libpq, kept apart from its
// I/O: a failed connection attempt, a result's rows or refusal, and statement
// parameters as libpq takes them. Private to the backend.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "statement_outcome.hpp"

struct pg_conn;
struct pg_result;

namespace pgmutex::postgres_detail {

// libpq's message without its trailing newline.
[[nodiscard]] std::string trimmed(const char* text);

// Why a connection attempt failed. With PQERRORS_VERBOSE libpq writes a
// server's refusal as "...failed: FATAL:  28P01: password authentication
// failed ...\nLOCATION: ...": the SQLSTATE tells a refusal (wrong password,
// no such database or role) from an unreachable server, whatever the
// language of the messages. With several hosts the last answer counts.
[[nodiscard]] StatementFailure connect_failure(pg_conn* connection);

// A successful result's rows and affected count.
[[nodiscard]] Rows rows_of(pg_result* result);
// A failed result: the server's refusal (with its SQLSTATE) or, without one, a lost connection.
[[nodiscard]] StatementFailure failure_of(pg_result* result);

// Parameters as libpq takes them; valid while `params` lives.
[[nodiscard]] std::vector<const char*> values_of(const std::vector<std::string>& params);

}  // namespace pgmutex::postgres_detail
