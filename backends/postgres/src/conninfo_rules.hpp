// The connection-string values libpq refuses before it tries any server
// (sslmode=bogus, port=x, ...). libpq reports them as it reports an unreachable
// server, and in the user's language, so they are checked here, by keyword:
// a typo must fail at once as the caller's mistake, never be retried as an
// outage. Private to the backend.
#pragma once

#include <optional>
#include <string>

namespace pgmutex::postgres_detail {

// Why libpq would refuse a value of `conninfo` (or of the PG* variable that
// stands in for a keyword it lacks), naming the keyword, the value and the
// rule; nullopt when every checked value is valid. `conninfo` must parse.
std::optional<std::string> conninfo_value_error(const std::string& conninfo);

}  // namespace pgmutex::postgres_detail
