// What to do about a database refusal that retrying cannot fix: the exact
// command or SQL to run, with the user's own connection flags (password masked)
// and role, so that the fix can be pasted as it is.
#pragma once

#include <string>

#include "arguments.hpp"

namespace pgmutex::cli {

// "pgmutex schema --dsn '...' --table T": the flags the user gave (--dsn only
// if given as a flag; its password masked), each quoted for a POSIX shell.
[[nodiscard]] std::string schema_command(const ConnectionArgs& connection);

// The role the connection logs in as, as libpq picks it: the DSN's user, else
// PGUSER, else the OS user.
[[nodiscard]] std::string connection_role(const ConnectionArgs& connection);

// The GRANTs a role needs to run and inspect locks in `table`:
// "GRANT SELECT, INSERT, UPDATE, DELETE ON t TO r; GRANT USAGE ON SEQUENCE t_fence_seq TO r".
[[nodiscard]] std::string lock_grants(const std::string& table, const std::string& role);

// The GRANT that lets a role create `table` (CREATE on its schema).
[[nodiscard]] std::string schema_grant(const std::string& table, const std::string& role);

}  // namespace pgmutex::cli
