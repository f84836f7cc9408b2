// The one place where failures become pgmutex errors: a StatementFailure (from
// either engine; libpqxx's exceptions are first turned into one here too) is
// mapped by kind, then SQLSTATE, to an Errc, and its text is scrubbed of
// secrets. Private to the backend.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "pgmutex/error.hpp"
#include "statement_outcome.hpp"

namespace pgmutex::postgres_detail {

// What a statement may have done when it failed without an answer.
enum class Effect {
  read,              // nothing: safe to retry
  idempotent_write,  // applying it twice is harmless (heartbeat, create_schema): retried once
  write,             // the outcome matters (acquire, release): retried only if it surely did not run
};

Error to_error(const StatementFailure& failure, std::string_view what, Effect effect,
               const std::vector<std::string>& secrets);

// The connection cannot be used again (lost, timed out, or the server ended the session).
bool connection_gone(const StatementFailure& failure) noexcept;

// Whether trying again on a fresh connection is safe for `effect`: a write
// only if it surely did not run (never sent, or the server said so).
bool may_retry(const StatementFailure& failure, Effect effect) noexcept;

// Call inside a catch block: the libpqxx (or other) exception in flight as a StatementFailure.
StatementFailure failure_from_current_exception() noexcept;

}  // namespace pgmutex::postgres_detail
