// An election's NOTIFY payload (election_sql.cpp's notify) read back into the
// change it carries, whole, so that an observer needs no statement per
// change: 'e:<kind>:<change>:<term>:<since µs>:<n>:<instance><m>:<host><value>',
// n and m the byte lengths of the instance and the host. Private to the backend.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

#include "pgmutex/backend.hpp"

namespace pgmutex::postgres_detail {

inline std::optional<ElectionNotice> election_notice_of(std::string_view payload) {
  if (payload.size() < 4 || !payload.starts_with("e:") || payload[3] != ':') return std::nullopt;
  ElectionNotice n;
  n.kind = payload[2];
  if (n.kind != 'l' && n.kind != 'p' && n.kind != 'v') return std::nullopt;
  std::string_view rest = payload.substr(4);
  // A number, then ':'.
  auto number = [&rest](std::int64_t& out) {
    const auto end = rest.find(':');
    if (end == std::string_view::npos) return false;
    if (std::from_chars(rest.data(), rest.data() + end, out).ec != std::errc{}) return false;
    rest.remove_prefix(end + 1);
    return true;
  };
  // A length, ':', then that many bytes.
  auto sized = [&](std::string& out) {
    std::int64_t n = 0;
    if (!number(n) || n < 0 || static_cast<std::uint64_t>(n) > rest.size()) return false;
    out.assign(rest.substr(0, static_cast<std::size_t>(n)));
    rest.remove_prefix(static_cast<std::size_t>(n));
    return true;
  };
  if (!number(n.change) || !number(n.term) || !number(n.since_us) || !sized(n.instance_id) || !sized(n.host))
    return std::nullopt;
  n.value.assign(rest);
  return n;
}

}  // namespace pgmutex::postgres_detail
