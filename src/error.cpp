// The error category's names and messages, Error::message(), and throw_error(),
// which raises the exception that matches an error (pgmutex/error.hpp).
#include "pgmutex/error.hpp"

namespace pgmutex {
namespace {

class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "pgmutex"; }
  std::string message(int value) const override {
    switch (static_cast<Errc>(value)) {
      case Errc::lock_held: return "lock held by another instance";
      case Errc::lock_not_held: return "lock not held";
      case Errc::lease_lost: return "lease lost";
      case Errc::timeout: return "timed out";
      case Errc::cancelled: return "cancelled";
      case Errc::already_acquired: return "already acquired through this object";
      case Errc::backend_unavailable: return "backend unavailable";
      case Errc::outcome_unknown: return "outcome unknown";
      case Errc::invalid_argument: return "invalid argument";
      case Errc::backend_error: return "backend error";
      case Errc::permission_denied: return "permission denied";
      case Errc::schema_missing: return "schema missing";
    }
    return "unknown pgmutex error";
  }
};

}  // namespace

const std::error_category& error_category() noexcept {
  static const Category category;
  return category;
}

std::string Error::message() const {
  std::string text = code.message();
  if (!detail.empty()) {
    text += ": ";
    text += detail;
  }
  return text;
}

void throw_error(const Error& e) {
  if (e.code.category() == error_category()) {
    switch (static_cast<Errc>(e.code.value())) {
      case Errc::lock_not_held:
      case Errc::lease_lost: throw LockNotHeldError(e);
      case Errc::lock_held:
      case Errc::already_acquired: throw LockHeldError(e);
      case Errc::timeout: throw LockTimeoutError(e);
      case Errc::invalid_argument: throw InvalidArgumentError(e);
      case Errc::backend_unavailable:
      case Errc::outcome_unknown:
      case Errc::backend_error:
      case Errc::permission_denied:
      case Errc::schema_missing: throw BackendError(e);
      case Errc::cancelled: break;
    }
  }
  throw LockError(e);
}

}  // namespace pgmutex
