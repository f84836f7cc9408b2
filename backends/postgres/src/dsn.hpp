// Connection strings: what of them may be shown, and how to keep secrets out
// of every message. Private to the backend.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace pgmutex::postgres_detail {

// True for postgres:// and postgresql:// URIs; anything else is the keyword form.
bool is_uri(std::string_view dsn) noexcept;

// The DSN with every password value replaced by "********".
std::string redact_dsn(std::string_view dsn);

// The secrets a message must never show: the DSN's password (raw and, for a
// URI, percent-decoded) and PGPASSWORD.
std::vector<std::string> secrets_of(std::string_view dsn);

// `text` with each secret replaced by "********".
std::string scrub(std::string text, const std::vector<std::string>& secrets);

// The DSN with connect_timeout added when neither it nor PGCONNECT_TIMEOUT sets one.
std::string with_connect_timeout(std::string dsn, std::chrono::nanoseconds timeout);

// The DSN with tcp_user_timeout and keepalive settings derived from `timeout`,
// each added only when the DSN does not set it (libpq applies them to TCP only).
std::string with_network_timeout(std::string dsn, std::chrono::nanoseconds timeout);

}  // namespace pgmutex::postgres_detail
