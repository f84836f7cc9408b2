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

void exit_with(const Error& error, const std::string& what) {
  std::string message = what + ": " + error.message();
  // The commonest first-run mistake: the table was never created.
  if (error == Errc::backend_error && error.detail.find("does not exist") != std::string::npos)
    message += " (create the table with 'pgmutex schema')";
  throw Exit(exit_code_for(error), message);
}

}  // namespace pgmutex::cli
