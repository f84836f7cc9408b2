// A multi-host connection string ("host=a,b port=x,y", or
// "postgresql://a:x,b:y/db") tried one host at a time, each with its own
// share of the connect budget. libpq moves on to the next host when
// connect_timeout runs out, but only in its blocking connect: PQconnectPoll
// ignores connect_timeout, so a non-blocking caller that waits for one
// deadline spends all of it on a first host that never answers. So the
// backend walks the hosts itself, in libpq's order and by libpq's rules.
// Private to the backend.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "pq_connection.hpp"

namespace pgmutex::postgres_detail {

// One connection attempt: a single-host connection string, and how a message names its server.
struct HostAttempt {
  std::string conninfo;
  std::string server;  // "host db1 port 5432"; empty for a connection string tried as it is
};

// The attempts libpq itself makes for `conninfo` (its host, hostaddr and
// port lists, from the string or from PGHOST, PGHOSTADDR and PGPORT): one per
// host, in order, each naming that host's entries alone, everything else
// kept; with target_session_attrs=prefer-standby, every host as a standby
// first, then every host as any server. A single host: the string itself,
// as one attempt. `conninfo` must parse and pass conninfo_value_error.
std::vector<HostAttempt> host_attempts(const std::string& conninfo);

// Tries the attempts in turn, each for at most `per_host` (none of its own
// when not positive) and at most an even share of the time left until
// `deadline` for the attempts not yet made: the first to connect wins. As
// in libpq, a server that cannot be reached, that is not ready (57P03), or
// that is the wrong kind for target_session_attrs sends it to the next host;
// a server that refuses the login (a wrong password, no such database) ends
// the walk with its answer. When every host failed, the failure names each.
Outcome<PqConnection> open_first(const std::vector<HostAttempt>& attempts, std::chrono::nanoseconds per_host,
                                 Deadline deadline);

// How long each host may take to connect: the connection string's own
// connect_timeout (else PGCONNECT_TIMEOUT's) read as libpq reads it (whole
// seconds, at least 2; 0: no limit per host), else `option`.
std::chrono::nanoseconds connect_timeout_per_host(const std::string& dsn, std::chrono::nanoseconds option);

}  // namespace pgmutex::postgres_detail
