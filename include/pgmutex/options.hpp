// What a mutex is configured with, and the rules each option must keep.
#pragma once

#include <chrono>
#include <concepts>
#include <optional>
#include <string>
#include <string_view>

#include "pgmutex/error.hpp"

namespace pgmutex {

using namespace std::chrono_literals;

namespace detail {
template <class T>
using Given = T;
}  // namespace detail

// Options and ValidOptions are one record: the two optional members are
// std::optional in what the user gives, and filled in once validate() passed.
// Every member is described (doc, unit, flag, rule) in describe/options.hpp.
template <template <class> class Defaulted>
struct BasicOptions {
  std::string lock_name = {};   // 1..64 characters (as VARCHAR(64) counts them)
  std::string instance_id = {}; // empty: "<hostname>-<random>"; else 1..64 characters, unique per process
  std::string table = "mutex_lock";  // [schema.]table, read by psql's rules (pgmutex/table_name.hpp)
  std::chrono::nanoseconds heartbeat_interval = 10s;
  std::chrono::nanoseconds alert_threshold = 30s;   // observers raise `alert` past this age
  std::chrono::nanoseconds stale_threshold = 600s;  // any instance may reclaim past this age
  std::chrono::nanoseconds poll_interval = 500ms;   // blocking acquire: time between tries
  // The holder declares its lease lost after stale_threshold - safety_margin
  // without a good heartbeat, so it stops before anyone can reclaim.
  // It must cover one whole heartbeat attempt (heartbeat_timeout), plus one
  // heartbeat_interval where the backend commits heartbeats asynchronously
  // (a server crash may forget the last one it acknowledged).
  // Default: max(stale_threshold / 10, 1.5 * heartbeat_interval), at most
  // (stale_threshold - heartbeat_interval) / 2.
  Defaulted<std::chrono::nanoseconds> safety_margin = {};
  // The longest one heartbeat or release attempt may take, reconnects
  // included: the statement's lock_timeout and statement_timeout and the
  // client's deadline on the socket. Default: min(safety_margin / 3, 10s).
  Defaulted<std::chrono::nanoseconds> heartbeat_timeout = {};
  // A queued waiter offered the lock by a release must confirm within this,
  // or it loses its turn to the next live waiter (a frozen or slow waiter
  // costs the line this long at most; skipping it costs fairness, never
  // exclusion). Default: min(2s, stale_threshold - safety_margin).
  Defaulted<std::chrono::nanoseconds> handoff_deadline = {};

  // How long the holder trusts its last good heartbeat (validated options only).
  [[nodiscard]] std::chrono::nanoseconds lease() const
    requires std::same_as<Defaulted<int>, int>
  {
    return stale_threshold - safety_margin;
  }
};

// What the user configures a mutex with.
using Options = BasicOptions<std::optional>;

// Options that passed validate(): instance_id, safety_margin and heartbeat_timeout are filled in.
using ValidOptions = BasicOptions<detail::Given>;

// What the backend tells the rules: whether an acknowledged heartbeat can
// still be lost (asynchronous commit), so the margin must cover an interval more.
struct BackendTraits {
  bool heartbeat_commits_asynchronously = false;
};

// Checks every rule; the error names the option and the rule it breaks.
[[nodiscard]] Result<ValidOptions> validate(Options options, BackendTraits backend = {});

// Each rule on its own, for the command-line tool and backends.
[[nodiscard]] Result<void> validate_lock_name(std::string_view name, std::string_view option = "lock_name");
[[nodiscard]] Result<void> validate_table_name(std::string_view table);

// Characters as Postgres counts them in VARCHAR(n): code points of valid UTF-8.
[[nodiscard]] std::optional<std::size_t> utf8_length(std::string_view text) noexcept;

// "<hostname>-<8 random hex digits>", cut to fit 64 characters.
[[nodiscard]] std::string default_instance_id();

namespace detail {
// A mutex's options for another lock name (a singleton's given per call):
// the same in every other respect. An invalid name is Errc::invalid_argument
// naming the name given and the rule it breaks.
[[nodiscard]] Result<Options> options_for_lock(const ValidOptions& options, std::string_view lock_name);
}  // namespace detail

}  // namespace pgmutex
