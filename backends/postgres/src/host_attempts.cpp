// A multi-host connection string tried one host at a time, each within its
// own share of the connect budget (host_attempts.hpp).
#include "host_attempts.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <optional>

#include <libpq-fe.h>

#include "error_mapping.hpp"

namespace pgmutex::postgres_detail {
namespace {

using Values = std::map<std::string, std::string, std::less<>>;

// The keywords the string sets, as libpq parsed them (a URI's too, decoded).
Values given_values(const std::string& conninfo) {
  Values values;
  if (PQconninfoOption* given = PQconninfoParse(conninfo.c_str(), nullptr)) {
    for (PQconninfoOption* o = given; o->keyword != nullptr; ++o)
      if (o->val != nullptr) values[o->keyword] = o->val;
    PQconninfoFree(given);
  }
  return values;
}

// The string's value for `keyword`, else its environment variable's (libpq's order).
std::optional<std::string> effective(const Values& given, std::string_view keyword, const char* variable) {
  if (const auto found = given.find(keyword); found != given.end()) return found->second;
  if (const char* value = std::getenv(variable)) return std::string(value);
  return std::nullopt;
}

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> entries;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = list.find(',', start);
    entries.push_back(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return entries;
    start = comma + 1;
  }
}

// A keyword-form value, quoted as libpq reads it: an empty entry stays
// empty (libpq's default host or port), never "unset" (which the
// environment would fill).
std::string quoted(const std::string& value) {
  std::string out = "'";
  for (const char c : value) {
    if (c == '\'' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "'";
}

// The entry for host `i` of a list: its own, or the only one for every host.
const std::string& entry(const std::vector<std::string>& list, std::size_t i) {
  return list.size() == 1 ? list.front() : list[i];
}

std::string seconds_text(std::chrono::nanoseconds d) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  std::string text = std::to_string(ms / 1000);
  if (ms % 1000 != 0) {
    std::string fraction = std::to_string(1000 + ms % 1000).substr(1);
    while (fraction.back() == '0') fraction.pop_back();
    text += "." + fraction;
  }
  return text + " s";
}

}  // namespace

std::vector<HostAttempt> host_attempts(const std::string& conninfo) {
  const Values given = given_values(conninfo);
  const auto hosts = effective(given, "host", "PGHOST");
  const auto addresses = effective(given, "hostaddr", "PGHOSTADDR");
  const auto ports = effective(given, "port", "PGPORT");
  // libpq counts the hostaddr entries if there are any, else the host entries.
  std::vector<std::string> host_list, address_list, port_list;
  if (hosts && !hosts->empty()) host_list = split_commas(*hosts);
  if (addresses && !addresses->empty()) address_list = split_commas(*addresses);
  if (ports && !ports->empty()) port_list = split_commas(*ports);
  const std::size_t count = !address_list.empty() ? address_list.size() : std::max<std::size_t>(1, host_list.size());
  const bool lists_match = (host_list.empty() || host_list.size() == count) &&
                           (port_list.empty() || port_list.size() == 1 || port_list.size() == count);
  if (count < 2 || !lists_match) return {HostAttempt{conninfo, {}}};  // libpq's own walk (and its errors)

  // Everything but the host's own entries, kept as written.
  const auto attrs = effective(given, "target_session_attrs", "PGTARGETSESSIONATTRS");
  const bool prefer_standby = attrs && *attrs == "prefer-standby";
  std::string rest;
  for (const auto& [keyword, value] : given) {
    if (keyword == "host" || keyword == "hostaddr" || keyword == "port") continue;
    if (prefer_standby && keyword == "target_session_attrs") continue;
    rest += " " + keyword + "=" + quoted(value);
  }
  // prefer-standby is libpq's two rounds: every host as a standby, then every host as any server.
  const std::vector<std::string> rounds = prefer_standby ? std::vector<std::string>{" target_session_attrs='standby'",
                                                                                    " target_session_attrs='any'"}
                                                         : std::vector<std::string>{""};
  std::vector<HostAttempt> attempts;
  for (const std::string& round : rounds) {
    for (std::size_t i = 0; i < count; ++i) {
      std::string own, server;
      if (!host_list.empty()) {
        own += " host=" + quoted(host_list[i]);
        server += "host " + (host_list[i].empty() ? std::string("(default)") : host_list[i]);
      }
      if (!address_list.empty()) {
        own += " hostaddr=" + quoted(address_list[i]);
        server += (server.empty() ? "" : " ") + std::string("hostaddr ") + address_list[i];
      }
      if (!port_list.empty()) {
        own += " port=" + quoted(entry(port_list, i));
        server += " port " + (entry(port_list, i).empty() ? std::string("(default)") : entry(port_list, i));
      }
      attempts.push_back(HostAttempt{own.substr(1) + rest + round, std::move(server)});
    }
  }
  return attempts;
}

Outcome<PqConnection> open_first(const std::vector<HostAttempt>& attempts, std::chrono::nanoseconds per_host,
                                 Deadline deadline) {
  // Each attempt's end: its per-host budget, but no more than an even share
  // of the time left for the attempts not yet made, so the last host is
  // tried too when the operation's deadline is nearer than all the budgets.
  const auto attempt_by = [&](std::size_t attempts_left) {
    if (per_host <= std::chrono::nanoseconds::zero()) return deadline;  // libpq's connect_timeout=0: no limit per host
    const auto now = std::chrono::steady_clock::now();
    const auto fair = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now) /
                      static_cast<long>(attempts_left);
    return now + std::min(per_host, std::max(fair, std::chrono::nanoseconds::zero()));
  };
  if (attempts.size() == 1) return PqConnection::open(attempts.front().conninfo, attempt_by(1));

  std::string reasons;
  bool all_timed_out = true;
  std::size_t tried = 0;
  for (const HostAttempt& attempt : attempts) {
    const auto start = std::chrono::steady_clock::now();
    if (start >= deadline) break;
    const Deadline by = attempt_by(attempts.size() - tried);
    ++tried;
    auto opened = PqConnection::open(attempt.conninfo, by);
    if (opened) return opened;
    StatementFailure& failure = opened.error();
    // The server answered and refused us: as in libpq, the other hosts are not asked.
    if (failure.kind == StatementFailure::Kind::server && !connection_gone(failure)) return opened;
    all_timed_out = all_timed_out && failure.kind == StatementFailure::Kind::timeout;
    if (!reasons.empty()) reasons += "; ";
    if (failure.kind == StatementFailure::Kind::timeout)
      reasons += attempt.server + ": " + failure.message +
                 (by < deadline ? " (its share of the connect budget, " +
                                      seconds_text(std::chrono::duration_cast<std::chrono::nanoseconds>(by - start)) +
                                      ", ran out)"
                                : " (the operation's deadline passed)");
    else
      reasons += failure.message;
  }
  if (tried < attempts.size())
    reasons += "; " + std::to_string(attempts.size() - tried) + " of " + std::to_string(attempts.size()) +
               " host attempts not made: the operation's deadline passed";
  return tl::unexpected(StatementFailure{
      all_timed_out ? StatementFailure::Kind::timeout : StatementFailure::Kind::connection_lost, {},
      std::move(reasons), false});
}

std::chrono::nanoseconds connect_timeout_per_host(const std::string& dsn, std::chrono::nanoseconds option) {
  const auto text = effective(given_values(dsn), "connect_timeout", "PGCONNECT_TIMEOUT");
  if (!text) return option;
  char* end = nullptr;
  errno = 0;
  const long seconds = std::strtol(text->c_str(), &end, 10);
  if (end == text->c_str() || errno != 0) return option;  // refused before any connect (conninfo_rules)
  if (seconds <= 0) return std::chrono::nanoseconds::zero();
  return std::chrono::seconds(std::max(2L, seconds));
}

}  // namespace pgmutex::postgres_detail
