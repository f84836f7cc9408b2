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
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

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
  double stale_after_s = 0.0; // the age at which the row is stale for the reader: the larger of its
                              // threshold and the holder's

  // Somebody leads: the term was announced, not vacated, and its grant is live.
  [[nodiscard]] bool leading() const noexcept { return announced && lock_live && lock_fence == term; }
};

// Who leads a lock, as BasicElection::leader() reads it.
struct Leader {
  Fence term = 0;
  std::string value;
  std::string instance_id;
  std::string host;  // empty: not recorded
  std::chrono::system_clock::time_point since;  // when the term began (server clock)
};

// The leader a record shows; nullopt while nobody leads.
[[nodiscard]] inline std::optional<Leader> leader_of(const LeaderRecord& r) {
  if (!r.leading()) return std::nullopt;
  return Leader{r.term, r.value, r.instance_id, r.host,
                std::chrono::system_clock::time_point(
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::microseconds(r.since_us)))};
}

// What an observer is told (pgmutex/observer.hpp).
enum class LeaderEvent : unsigned char {
  current,     // the first report, or after a resync: who leads now (perhaps nobody)
  elected,     // a new term began
  proclaimed,  // the leader announced another value within its term
  vacated,     // the leader resigned: nobody leads until the next is elected
  expired,     // the leader's lease ran out (it stopped heartbeating): nobody leads
};

// One change of a lock's leadership, in term order.
struct LeaderChange {
  LeaderEvent event = LeaderEvent::current;
  Fence term = 0;                // the term this change concerns (vacated, expired: the term that ended)
  std::int64_t change = 0;       // the server's count of announcements of the lock
  std::optional<Leader> leader;  // who leads after it; nullopt: nobody
  // Changes were missed before this one (a lost connection, a failover,
  // changes faster than the observer read them): this one says where
  // things stand now. missed: how many, when the count tells (nullopt: a
  // failover's history, where it cannot).
  bool gap = false;
  std::optional<std::int64_t> missed;
};

// One announcement, as a notification carries it (whole: kind, count, term,
// and the row's values), so observers need no statement per change.
struct ElectionNotice {
  char kind = 'l';  // 'l' elected, 'p' proclaimed, 'v' vacated
  std::int64_t change = 0;
  Fence term = 0;
  std::int64_t since_us = 0;
  std::string instance_id, host, value;
};

// What an observer's wait brings: notices in the order sent, or `resync`
// (the backend began listening just now, on a new connection perhaps: what
// happened before is read with leader()). Empty: the timeout or the stop.
struct ElectionWake {
  std::vector<ElectionNotice> notices;
  bool resync = false;
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

// Why the holder of `key` could not `what` ("announce", "vacate"): its
// Errc::lock_not_held, worded once so that every backend says the same (the
// user reads it, whichever backend runs the tests). `held`: whether the key
// still held the lock; `record`: the election row as the statement left it.
// Three cases: the key no longer holds the lock (released, taken over, or,
// for an announce, past its lease); its term was vacated (a resign under
// way); a higher term is recorded than the grant's fence, which only a fence
// sequence that restarted below the election's terms can cause, so the text
// names both numbers and the repair.
[[nodiscard]] tl::unexpected<Error> term_refused(const HolderKey& key, std::string_view what, bool held,
                                                 const LeaderRecord& record);

// A backend that keeps elections: who leads (one read), and the holder's
// announcements. announce and vacate answer Errc::lock_not_held when the key
// does not hold the lock (its term is over), and change nothing then; an
// announce also when its term was vacated or a higher one is recorded
// (term_refused says which).
template <class B>
concept BackendKeepsElections = requires(B& b, const HolderKey& key, std::string_view value, LockRef lock,
                                         std::chrono::nanoseconds stale_threshold) {
  { b.leader(lock, stale_threshold) } noexcept -> std::same_as<Result<LeaderRecord>>;
  { b.announce(key, value) } noexcept -> std::same_as<Result<LeaderRecord>>;
  { b.vacate(key) } noexcept -> std::same_as<Result<LeaderRecord>>;
};

// What a campaign's acquire carries (BackendElectsInOneStatement): in, the
// value to announce; out, whether the grant the try made or confirmed for
// itself was announced with it, in the same transaction as the grant.
struct GrantAnnouncement {
  std::string_view value;
  bool announced = false;
};

// One statement per transition of an election (issue 18, phase 6), so that
// resign -> successor costs what the queue's handoff costs: the release and
// the successor's confirm.
//
// - try_acquire(request, announcement): a try as try_acquire(request) (plain
//   or queued, the same rules, the same answer) that, when it grants the lock
//   to the request itself (a free or stale lock taken, an offer confirmed),
//   announces announcement.value as the new term's in the same transaction:
//   observers hear 'elected' at its commit. It sets announcement.announced
//   when the election record now shows the grant's term announced; false
//   with a grant means the server refused the announce (it records a term at
//   or above the grant's fence) or could not tell (a retried confirm): the
//   caller then announces on its own (announce(), idempotent) or gives the
//   lock up. A try that grants nothing announces nothing and writes nothing
//   more than the plain try would. A value the rules refuse
//   (validate_election_value) is Errc::invalid_argument before any statement.
// - release_vacating(key): release(key), and in the same statement the
//   grant's term vacated if it is announced (observers hear 'vacated', then
//   the successor's 'elected'). Keyed by the grant as release is, so it
//   vacates only its own term, and does so whether or not the holder's lease
//   ran out on its clock (review finding 4); Errc::lock_not_held when no row
//   matches, and nothing changes then.
//
// The value rides on the acquire as a separate argument rather than a field
// of AcquireRequest, and the vacate as a separate operation rather than a
// flag of HolderKey: a plain Mutex's request, key, statements and in-memory
// path stay byte for byte what they were, and pay nothing for elections.
template <class B>
concept BackendElectsInOneStatement =
    requires(B& b, const AcquireRequest& request, GrantAnnouncement& announcement, const HolderKey& key) {
      { b.try_acquire(request, announcement) } noexcept -> std::same_as<Result<AcquireResult>>;
      { b.release_vacating(key) } noexcept -> std::same_as<Result<void>>;
    };

// A backend whose observers wait for announcements without a statement
// (LISTEN): until a notice, the timeout or `stop`. A backend without it is
// observed by reading leader() every poll_interval (the in-memory one).
template <class B>
concept BackendWaitsForElections = requires(B& b, LockRef lock, std::chrono::nanoseconds timeout, std::stop_token stop) {
  { b.wait_for_election(lock, timeout, stop) } noexcept -> std::same_as<Result<ElectionWake>>;
};

}  // namespace pgmutex
