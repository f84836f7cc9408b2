// Fuzz target: identifier validation. validate_table_name() and
// validate_lock_name() never crash on any bytes, and what they accept is safe:
// a table name is one or two identifiers by psql's rules whose quoted form
// (the only form that reaches SQL) reads back as exactly those identifiers,
// whose printed form reads back as the same table, and whose derived names fit; a lock name
// (always a bound parameter) is 1..64 characters of valid UTF-8 with no NUL.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "pgmutex/options.hpp"
#include "pgmutex/table_name.hpp"
#include "sql.hpp"

namespace {

[[noreturn]] void fail(const char* what, std::string_view input) {
  std::fprintf(stderr, "%s: [%.*s]\n", what, static_cast<int>(input.size()), input.data());
  std::abort();
}

// Reads a quoted SQL name ("a"."b", with "" for a quote) back into its parts;
// empty if it is not one.
std::vector<std::string> unquote(std::string_view sql) {
  std::vector<std::string> parts;
  std::size_t i = 0;
  while (i < sql.size()) {
    if (sql[i] != '"') return {};
    std::string part;
    for (++i;; ++i) {
      if (i >= sql.size()) return {};
      if (sql[i] == '"') {
        if (i + 1 < sql.size() && sql[i + 1] == '"') {
          part.push_back('"');
          ++i;
          continue;
        }
        ++i;
        break;
      }
      part.push_back(sql[i]);
    }
    parts.push_back(part);
    if (i < sql.size()) {
      if (sql[i] != '.') return {};
      ++i;
      if (i >= sql.size()) return {};
    }
  }
  return parts;
}

bool valid_part(std::string_view s) { return !s.empty() && s.size() <= 63 && s.find('\0') == std::string_view::npos; }

// Strict UTF-8 (no overlongs, no surrogates, at most U+10FFFF): the characters, or -1.
long utf8_characters(std::string_view s) {
  long count = 0;
  for (std::size_t i = 0; i < s.size(); ++count) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    unsigned long cp = 0;
    if (c < 0x80) { n = 1; cp = c; }
    else if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; }
    else return -1;
    if (i + n > s.size()) return -1;
    for (std::size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return -1;
      cp = cp << 6 | (d & 0x3F);
    }
    static constexpr unsigned long least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    i += n;
  }
  return count;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  if (pgmutex::validate_table_name(input)) {
    const auto name = pgmutex::parse_table_name(input).value();
    const auto parts = unquote(pgmutex::postgres_detail::quote_table(input));
    const std::vector<std::string> want =
        name.schema.empty() ? std::vector<std::string>{name.name} : std::vector<std::string>{name.schema, name.name};
    if (parts != want) fail("accepted table does not quote to the parts psql's rules read", input);
    for (const std::string& part : parts)
      if (!valid_part(part)) fail("accepted table has an empty, NUL-holding or over-63-byte part", input);
    // The name every hint prints reads back, by the same rules, as the same table.
    const auto again = pgmutex::parse_table_name(pgmutex::sql_name(name));
    if (!again || again->schema != name.schema || again->name != name.name)
      fail("the printed name of an accepted table does not read back as it", input);
    // Derived names fit, so Postgres never cuts them short.
    if (pgmutex::fence_sequence_of(name).name.size() > 63 || pgmutex::unique_constraint_of(name).size() > 63)
      fail("a derived name is over 63 bytes", input);
  }

  const auto lock = pgmutex::validate_lock_name(input);
  const long characters = utf8_characters(input);
  if (lock) {
    if (input.find('\0') != std::string_view::npos) fail("accepted lock name holds a NUL", input);
    if (characters < 1 || characters > 64) fail("accepted lock name is not 1..64 characters of valid UTF-8", input);
  } else if (characters >= 1 && characters <= 64 && input.find('\0') == std::string_view::npos) {
    fail("rejected a valid lock name", input);
  }
  return 0;
}
