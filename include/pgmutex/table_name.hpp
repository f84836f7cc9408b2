// A lock table's name as psql reads it, and the names derived from it (the
// fence sequence, the unique constraint), each fitting Postgres's 63 bytes.
#pragma once

#include <string>
#include <string_view>

#include "pgmutex/error.hpp"

namespace pgmutex {

// A name of the form schema.table or table, each part read as psql reads an
// identifier. Unquoted: a letter or underscore, then letters, digits,
// underscores or dollar signs (non-ASCII letters too), with ASCII folded to
// lower case, so Locks.Jobs is locks.jobs. Double-quoted: any characters but
// NUL, case kept, a doubled double quote for one, as in "lock-table".
// The whole is valid UTF-8. Each part is at most 63 bytes once read: Postgres would cut a longer one
// short, so it is refused instead. No schema: the search_path's first.
struct TableName {
  std::string schema;  // empty: none given
  std::string name;
};

// The parts of `table`, or invalid_argument naming the input and the rule.
[[nodiscard]] Result<TableName> parse_table_name(std::string_view table);

// One identifier as SQL needs it: bare if psql would read it back unchanged
// (lower case, digits, _, not starting with a digit), else double-quoted.
[[nodiscard]] std::string sql_identifier(std::string_view identifier);
// The table as SQL (and every hint) names it: schema.table, each part as sql_identifier.
[[nodiscard]] std::string sql_name(const TableName& table);

// A name made from the table's: `prefix + table + suffix` when that fits in
// 63 bytes (so every table of up to 53 bytes keeps the names it always had);
// else the table's name is cut (on a character boundary) and a hash of all of
// it added, so two long names with a common prefix never share a derived one.
[[nodiscard]] std::string derived_identifier(std::string_view prefix, std::string_view table, std::string_view suffix);
// The fence sequence, next to the table: mutex_lock -> mutex_lock_fence_seq.
[[nodiscard]] TableName fence_sequence_of(const TableName& table);
// The UNIQUE constraint's (and so its index's) name: per schema, so made from the table's (uq_mutex_lock).
[[nodiscard]] std::string unique_constraint_of(const TableName& table);

}  // namespace pgmutex
