// The SQL the backend sends: every statement for one table, built once, with
// the table name quoted and every value a bound parameter. Private to the backend.
#pragma once

#include <string>
#include <string_view>

namespace pgmutex::postgres_detail {

// A prepared statement: its name (unique per table and text) and its text.
struct Statement {
  std::string name;
  std::string sql;
};

struct TableStatements {
  std::string table;  // as the user wrote it (validated)
  Statement acquire;         // $1 lock_name, $2 instance_id, $3 stale seconds (float8)
  Statement heartbeat;       // $1 lock_name, $2 instance_id, $3 fence
  Statement release;         // $1 lock_name, $2 instance_id, $3 fence, $4 channel
  Statement inspect;         // $1 lock_name
  Statement list;            // no parameters
  Statement force_release;   // $1 lock_name, $2 channel
  Statement heartbeat_many;  // $1 lock_name[], $2 instance_id[], $3 fence[]
};

// `table` must have passed validate_table_name.
TableStatements make_statements(std::string_view table, bool heartbeat_synchronous_commit_off);

// "schema"."table" or "table".
std::string quote_table(std::string_view table);

// The schema statements, run in one transaction by create_schema.
std::string create_schema_sql(std::string_view table);
// "ALTER TABLE … ADD COLUMN fence …" for a table made by the seed.
std::string add_fence_sql(std::string_view table);

// The NOTIFY channel of one lock: an identifier derived by hashing, so any lock
// name is safe. Used unquoted only after this function made it.
std::string release_channel(std::string_view table, std::string_view lock_name);

// 64-bit FNV-1a, as 16 hex digits.
std::string hash_hex(std::string_view text);

}  // namespace pgmutex::postgres_detail
