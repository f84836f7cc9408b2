// The election's part of the Backend contract (issue 18): a lock's announced
// leader. An election is a lock whose holder announces a value: the term is
// the grant's fence, and every announcement is keyed by the grant as a
// heartbeat is, so only the holder of the term can make one. Included by
// pgmutex/backend.hpp.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pgmutex/backend.hpp"

namespace pgmutex {

// The most bytes a leader's value may have: with its header it rides on one
// NOTIFY, whose payload Postgres limits to 8000 bytes.
inline constexpr std::size_t max_election_value_bytes = 7168;

// A lock's election as the server has it now.
struct LeaderRecord {
  Fence term = 0;             // the last announced term (0: never announced)
  std::int64_t change = 0;    // announcements so far: one per election, proclaim and vacate
  bool announced = false;     // the term's holder announced it and has not vacated it
  std::string value;          // the last announced value of the term
  std::string instance_id;    // the term's holder
  std::string host;           // its host, as its grant recorded it; empty: not recorded
  std::int64_t since_us = 0;  // when the term began (server clock, microseconds since the epoch)
  Fence lock_fence = 0;       // the lock row's fence now (0: no row)
  double seconds_since_heartbeat = 0.0;  // the lock row's, server clock
  bool lock_live = false;     // the lock row is not stale for the reader's threshold

  // Somebody leads: the term was announced, not vacated, and its grant is live.
  [[nodiscard]] bool leading() const noexcept { return announced && lock_live && lock_fence == term; }
};

// One lock's election row, as a listing of a table's elections has it
// (PostgresBackend::list_elections, for `pgmutex status`).
struct ElectionRow {
  std::string lock_name;
  LeaderRecord record;
};

// Checks a value before any statement: at most max_election_value_bytes of
// valid UTF-8 with no NUL (a TEXT column, a NOTIFY payload). The error names
// the lock and the rule.
[[nodiscard]] Result<void> validate_election_value(std::string_view lock_name, std::string_view value);

// A backend that keeps elections: who leads (one read), and the holder's
// announcements. announce and vacate answer Errc::lock_not_held when the key
// does not hold the lock (its term is over), and change nothing then.
template <class B>
concept BackendKeepsElections = requires(B& b, const HolderKey& key, std::string_view value, LockRef lock,
                                         std::chrono::nanoseconds stale_threshold) {
  { b.leader(lock, stale_threshold) } noexcept -> std::same_as<Result<LeaderRecord>>;
  { b.announce(key, value) } noexcept -> std::same_as<Result<LeaderRecord>>;
  { b.vacate(key) } noexcept -> std::same_as<Result<LeaderRecord>>;
};

}  // namespace pgmutex
