#include "exit_codes.hpp"

namespace pgmutex::cli {

int exit_code_for(const Error& error) noexcept {
  if (error.code.category() != error_category()) return exit_code::software;
  switch (static_cast<Errc>(error.code.value())) {
    case Errc::invalid_argument: return exit_code::usage;
    case Errc::backend_unavailable:
    case Errc::outcome_unknown: return exit_code::unavailable;
    case Errc::lock_held:
    case Errc::timeout: return exit_code::temporary;
    case Errc::lock_not_held:
    case Errc::lease_lost:
    case Errc::cancelled:
    case Errc::already_acquired:
    case Errc::backend_error: return exit_code::software;
  }
  return exit_code::software;
}

void exit_with(const Error& error, const std::string& what, const std::string& table) {
  // The commonest first-run mistake: the table was never created.
  if (error.detail.find("SQLSTATE 42P01") != std::string::npos)
    throw Exit(exit_code::software, what + ": the lock table " + table +
                                        " does not exist: create it with 'pgmutex schema --table " + table + "'");
  // Postgres appends the statement and a caret on further lines: noise here.
  std::string message = error.message();
  if (const auto end = message.find('\n'); end != std::string::npos) message.resize(end);
  throw Exit(exit_code_for(error), what + ": " + message);
}

}  // namespace pgmutex::cli
