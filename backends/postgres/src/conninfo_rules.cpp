// Checks a connection string's values against libpq's own rules before any
// server is tried (conninfo_rules.hpp).
#include "conninfo_rules.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <string_view>

#include <libpq-fe.h>

namespace pgmutex::postgres_detail {
namespace {

// libpq 15's accepted values (fe-connect.c, connectOptions2).
struct Choice {
  std::string_view keyword;
  std::array<std::string_view, 6> values;
};
constexpr std::array<Choice, 4> choices{{
    {"sslmode", {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}},
    {"gssencmode", {"disable", "prefer", "require"}},
    {"channel_binding", {"disable", "prefer", "require"}},
    {"target_session_attrs", {"any", "read-write", "read-only", "primary", "standby", "prefer-standby"}},
}};

// Read as integers by libpq (parse_int_param: surrounding blanks allowed).
constexpr std::array<std::string_view, 6> integer_keywords{
    "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout"};

bool is_integer(std::string_view text, long& value) {
  const std::string copy(text);
  const char* start = copy.c_str();
  char* end = nullptr;
  errno = 0;
  value = std::strtol(start, &end, 10);
  if (end == start || errno != 0) return false;
  while (*end != '\0' && std::isspace(static_cast<unsigned char>(*end))) ++end;
  return *end == '\0';
}

std::string quoted(std::string_view value) { return "'" + std::string(value) + "'"; }

std::optional<std::string> choice_error(const Choice& choice, std::string_view value) {
  std::string allowed;
  for (std::string_view v : choice.values) {
    if (v.empty()) continue;
    if (v == value) return std::nullopt;
    allowed += allowed.empty() ? "" : ", ";
    allowed += v;
  }
  return std::string(choice.keyword) + "=" + quoted(value) + " is not one of " + allowed;
}

// port may list one port per host: "5432,5433"; an empty entry means the default.
std::optional<std::string> port_error(std::string_view ports) {
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = ports.find(',', start);
    const std::string_view port = ports.substr(start, comma == std::string_view::npos ? comma : comma - start);
    long value = 0;
    if (!port.empty() && (!is_integer(port, value) || value < 1 || value > 65535))
      return "port=" + quoted(port) + " is not a port number (1 to 65535)";
    if (comma == std::string_view::npos) return std::nullopt;
    start = comma + 1;
  }
}

// Each keyword's value: the connection string's, else its PG* variable's
// (PQconndefaults reads the environment).
std::map<std::string, std::string, std::less<>> effective_values(const std::string& conninfo) {
  std::map<std::string, std::string, std::less<>> values;
  if (PQconninfoOption* defaults = PQconndefaults()) {
    for (PQconninfoOption* o = defaults; o->keyword != nullptr; ++o)
      if (o->val != nullptr && o->envvar != nullptr && std::getenv(o->envvar) != nullptr) values[o->keyword] = o->val;
    PQconninfoFree(defaults);
  }
  if (PQconninfoOption* given = PQconninfoParse(conninfo.c_str(), nullptr)) {
    for (PQconninfoOption* o = given; o->keyword != nullptr; ++o)
      if (o->val != nullptr) values[o->keyword] = o->val;
    PQconninfoFree(given);
  }
  return values;
}

}  // namespace

std::optional<std::string> conninfo_value_error(const std::string& conninfo) {
  const auto values = effective_values(conninfo);
  const auto value_of = [&](std::string_view keyword) -> const std::string* {
    const auto found = values.find(keyword);
    return found == values.end() ? nullptr : &found->second;
  };
  for (const Choice& choice : choices)
    if (const std::string* value = value_of(choice.keyword))
      if (auto error = choice_error(choice, *value)) return error;
  for (std::string_view keyword : integer_keywords) {
    long ignored = 0;
    if (const std::string* value = value_of(keyword); value != nullptr && !value->empty() && !is_integer(*value, ignored))
      return std::string(keyword) + "=" + quoted(*value) + " is not an integer";
  }
  const auto count = [](const std::string& list) { return std::count(list.begin(), list.end(), ',') + 1; };
  // A multi-host list pairs its entries by position: one hostaddr per host.
  const std::string* names = value_of("host");
  const std::string* addresses = value_of("hostaddr");
  if (names != nullptr && addresses != nullptr && !names->empty() && !addresses->empty() &&
      count(*names) != count(*addresses))
    return "host=" + quoted(*names) + " lists " + std::to_string(count(*names)) + " host(s) but hostaddr=" +
           quoted(*addresses) + " lists " + std::to_string(count(*addresses)) +
           ": give one hostaddr per host, in the same order";
  const std::string* ports = value_of("port");
  if (ports == nullptr) return std::nullopt;
  if (auto error = port_error(*ports)) return error;
  // One port for every host, or one for all of them.
  const std::string* hosts = addresses != nullptr && !addresses->empty() ? addresses : names;
  const auto host_count = hosts != nullptr ? count(*hosts) : 1;
  if (count(*ports) != 1 && count(*ports) != host_count)
    return "port=" + quoted(*ports) + " lists " + std::to_string(count(*ports)) + " ports for " +
           std::to_string(host_count) + " host(s): give one port, or one per host";
  return std::nullopt;
}

}  // namespace pgmutex::postgres_detail
