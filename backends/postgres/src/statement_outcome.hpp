// What running one statement gives back, whichever engine ran it (our own
// libpq connection or a borrowed libpqxx one): rows as text, or why not.
// Turned into pgmutex errors in one place (error_mapping.hpp). Private to the backend.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pgmutex/error.hpp"

namespace pgmutex::postgres_detail {

struct Rows {
  std::vector<std::vector<std::optional<std::string>>> rows;
  long affected = 0;  // rows the statement changed (its command tag)

  [[nodiscard]] bool empty() const noexcept { return rows.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return rows.size(); }
  [[nodiscard]] bool is_null(std::size_t row, std::size_t column) const { return !rows.at(row).at(column).has_value(); }
  [[nodiscard]] const std::string& text(std::size_t row, std::size_t column) const { return rows.at(row).at(column).value(); }
};

struct StatementFailure {
  enum class Kind {
    server,           // the server refused it and said why (sqlstate)
    timeout,          // the operation's deadline passed; the connection was dropped
    connection_lost,  // the connection broke without the server saying why
    client,           // refused before sending (libpq could not build or send it)
  };
  StatementFailure() = default;
  StatementFailure(Kind k, std::string state, std::string text, bool was_sent)
      : kind(k), sqlstate(std::move(state)), message(std::move(text)), sent(was_sent) {}

  Kind kind = Kind::client;
  std::string sqlstate;
  std::string message;
  // The statement may have reached the server: for a write, its outcome is unknown.
  bool sent = false;
  // Refused as read-only (25006) by a server in recovery, or by one that
  // went away before it could say why: this connection reached a standby (a
  // demoted primary, or a proxy that has not switched yet), so the primary
  // is elsewhere or coming. Dropped and reconnected, the way a lost
  // connection is; never applied.
  bool on_standby = false;
  // The fix, when the caller knows it better than the SQLSTATE alone tells
  // (say, the GRANT for this table and role): replaces the generic one.
  std::string hint;
};

template <class T>
using Outcome = tl::expected<T, StatementFailure>;

}  // namespace pgmutex::postgres_detail
