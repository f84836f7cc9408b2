// Errors: one enum, one category, one Error value that carries a cause, and
// the exceptions that the throwing API raises. Every public operation returns
// Result<T>; its throwing twin calls throw_error() on the error.
#pragma once

#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <tl/expected.hpp>

namespace pgmutex {

enum class Errc {
  lock_held = 1,        // another instance holds the lock
  lock_not_held,        // this instance does not hold the lock (never had it, released, or lost it)
  lease_lost,           // the lease was lost: watchdog expired, or the row was taken over
  timeout,              // a blocking acquire ran out of time
  cancelled,            // a wait was cancelled through its stop_token
  already_acquired,     // this object already holds the lock: acquiring again would deadlock
  backend_unavailable,  // the backend cannot be reached now (transient: retry)
  outcome_unknown,      // the request may or may not have been applied
  invalid_argument,     // an option or argument breaks a rule
  backend_error,        // the backend refused the request for another reason (the detail says why)
  permission_denied,    // the backend refused us: a missing privilege, or authentication failed (not transient)
  schema_missing,       // the lock table, one of its columns, or the database does not exist (not transient)
};

}  // namespace pgmutex

template <>
struct std::is_error_code_enum<pgmutex::Errc> : std::true_type {};

namespace pgmutex {

const std::error_category& error_category() noexcept;

inline std::error_code make_error_code(Errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

// An error code plus the human cause ("lock 'job': connection refused").
// The detail never contains a password: backends scrub what they report.
struct Error {
  std::error_code code;
  std::string detail;

  Error() = default;
  Error(Errc e, std::string cause = {}) : code(make_error_code(e)), detail(std::move(cause)) {}
  Error(std::error_code c, std::string cause = {}) : code(c), detail(std::move(cause)) {}

  // "lock not held: lock 'job': row gone"
  [[nodiscard]] std::string message() const;

  friend bool operator==(const Error& e, Errc c) noexcept { return e.code == make_error_code(c); }
};

template <class T>
using Result = tl::expected<T, Error>;

inline tl::unexpected<Error> fail(Errc e, std::string cause = {}) {
  return tl::unexpected<Error>(Error(e, std::move(cause)));
}

// Tag that selects the non-throwing overload: mutex.try_acquire(pgmutex::nothrow).
struct nothrow_t {
  explicit nothrow_t() = default;
};
inline constexpr nothrow_t nothrow{};

class LockError : public std::system_error {
 public:
  explicit LockError(const Error& e) : std::system_error(e.code, e.detail) {}
};
class LockNotHeldError : public LockError {
  using LockError::LockError;
};
class LockHeldError : public LockError {
  using LockError::LockError;
};
class LockTimeoutError : public LockError {
  using LockError::LockError;
};
class BackendError : public LockError {
  using LockError::LockError;
};
class InvalidArgumentError : public LockError {
  using LockError::LockError;
};

// The one place that turns an Error into an exception of the matching type.
[[noreturn]] void throw_error(const Error& e);

template <class T>
T value_or_throw(Result<T>&& r) {
  if (!r) throw_error(r.error());
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}

}  // namespace pgmutex

