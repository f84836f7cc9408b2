// psql's identifier rules for the lock table's name, and the derived names.
#include "pgmutex/table_name.hpp"

#include <array>
#include <cstdint>

#include "pgmutex/options.hpp"

namespace pgmutex {
namespace {

constexpr std::size_t max_identifier_bytes = 63;  // Postgres NAMEDATALEN - 1

// As Postgres's lexer: a byte of a multi-byte character counts as a letter.
bool plain_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool plain_rest(char c) { return plain_start(c) || (c >= '0' && c <= '9') || c == '$'; }

constexpr std::string_view rule =
    "must be [schema.]table, each part an identifier as psql reads it: unquoted [A-Za-z_][A-Za-z0-9_$]* (folded to "
    "lower case; non-ASCII letters too) or double-quoted (\"lock-table\", \"\" for a quote), valid UTF-8, at most 63 "
    "bytes";

tl::unexpected<Error> refuse(std::string_view table, const std::string& why) {
  return fail(Errc::invalid_argument, "table '" + std::string(table) + "' " + why + ": it " + std::string(rule));
}

// Reads one part from `text` at `at`: its value, with `at` moved past it.
Result<std::string> read_part(std::string_view table, std::size_t& at) {
  std::string part;
  if (at < table.size() && table[at] == '"') {
    for (++at;; ++at) {
      if (at >= table.size()) return refuse(table, "has an unterminated quoted identifier");
      if (table[at] == '"') {
        if (at + 1 < table.size() && table[at + 1] == '"') {
          part.push_back('"');
          ++at;
          continue;
        }
        ++at;
        break;
      }
      if (table[at] == '\0') return refuse(table, "contains a NUL byte");
      part.push_back(table[at]);
    }
    if (part.empty()) return refuse(table, "has an empty quoted identifier");
  } else {
    if (at >= table.size() || !plain_start(table[at])) return refuse(table, "is not a valid name");
    for (; at < table.size() && plain_rest(table[at]); ++at)
      part.push_back(table[at] >= 'A' && table[at] <= 'Z' ? static_cast<char>(table[at] - 'A' + 'a') : table[at]);
  }
  if (part.size() > max_identifier_bytes)
    return refuse(table, "has a part of " + std::to_string(part.size()) + " bytes, which Postgres would cut short");
  return part;
}

std::string hash8(std::string_view text) {
  std::uint32_t h = 2166136261U;  // FNV-1a
  for (unsigned char c : text) {
    h ^= c;
    h *= 16777619U;
  }
  static constexpr std::array<char, 16> digits{'0', '1', '2', '3', '4', '5', '6', '7',
                                               '8', '9', 'a', 'b', 'c', 'd', 'e', 'f'};
  std::string out(8, '0');
  for (int i = 7; i >= 0; --i, h >>= 4) out[static_cast<std::size_t>(i)] = digits[h & 0xF];
  return out;
}

}  // namespace

Result<TableName> parse_table_name(std::string_view table) {
  if (!utf8_length(table)) return refuse(table, "is not valid UTF-8");
  std::size_t at = 0;
  auto first = read_part(table, at);
  if (!first) return tl::unexpected(std::move(first.error()));
  if (at == table.size()) return TableName{{}, std::move(*first)};
  if (table[at] != '.') return refuse(table, "is not a valid name");
  ++at;
  auto second = read_part(table, at);
  if (!second) return tl::unexpected(std::move(second.error()));
  if (at != table.size()) return refuse(table, "has more than two parts");
  return TableName{std::move(*first), std::move(*second)};
}

std::string sql_identifier(std::string_view identifier) {
  bool plain = !identifier.empty() && !(identifier[0] >= '0' && identifier[0] <= '9');
  for (char c : identifier) plain = plain && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
  if (plain) return std::string(identifier);
  std::string out = "\"";
  for (char c : identifier) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  return out + "\"";
}

std::string sql_name(const TableName& table) {
  return table.schema.empty() ? sql_identifier(table.name) : sql_identifier(table.schema) + "." + sql_identifier(table.name);
}

std::string derived_identifier(std::string_view prefix, std::string_view table, std::string_view suffix) {
  std::string whole = std::string(prefix) + std::string(table) + std::string(suffix);
  if (whole.size() <= max_identifier_bytes) return whole;
  const std::string tag = "_" + hash8(table);
  std::size_t keep = max_identifier_bytes - prefix.size() - suffix.size() - tag.size();
  while (keep > 0 && (static_cast<unsigned char>(table[keep]) & 0xC0) == 0x80) --keep;  // not inside a character
  return std::string(prefix) + std::string(table.substr(0, keep)) + tag + std::string(suffix);
}

TableName fence_sequence_of(const TableName& table) {
  return TableName{table.schema, derived_identifier("", table.name, "_fence_seq")};
}

std::string unique_constraint_of(const TableName& table) { return derived_identifier("uq_", table.name, ""); }

}  // namespace pgmutex
