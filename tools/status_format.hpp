// What `pgmutex status` shows: each lock's state, as a table or as JSON.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "arguments.hpp"
#include "pgmutex/backend.hpp"

namespace pgmutex::cli {

enum class LockState { ok, alert, expired, stale };

// One line of `status`: a held lock as the operator sees it. Described once
// in status_description.hpp; the text columns, the JSON keys and the
// Prometheus metrics are made from that description.
struct LockStatus {
  std::string lock;
  std::string instance;
  Fence fence = 0;
  std::chrono::system_clock::time_point acquired_at;
  double seconds_since_heartbeat = 0.0;
  LockState state = LockState::ok;
  std::int64_t queue_length = 0;  // waiters in its queue (StatusReport::queue: who)
  std::optional<std::string> host;     // empty: not recorded (a seed-made row, or a holder that did not say)
  std::optional<std::int64_t> pid;
  std::optional<std::string> command;
};

// A queued waiter's state: waiting its turn; offered the lock by a release
// and not yet confirmed; or dead (its connection closed, or, pooled, its
// lease ran out), to be skipped and swept by the next release.
enum class WaiterState { waiting, offered, dead };
[[nodiscard]] std::string_view to_string(WaiterState state) noexcept;
constexpr std::array<WaiterState, 3> all_values(WaiterState) {
  return {WaiterState::waiting, WaiterState::offered, WaiterState::dead};
}

// One waiter in a lock's queue, as `status` shows it (status_description.hpp).
struct WaiterStatus {
  std::string lock;
  std::int64_t position = 0;  // 1: next in line
  std::string instance;
  double seconds_waiting = 0.0;
  WaiterState state = WaiterState::waiting;
  std::optional<std::string> host;
  std::optional<std::int64_t> pid;
};

// One lock's election, as `status` shows it (status_description.hpp): the
// last term announced, whether its leader leads now, and what it announced.
struct LeaderStatus {
  std::string lock;
  Fence term = 0;
  bool leading = false;
  std::string instance;
  std::chrono::system_clock::time_point since;
  std::string value;
};

// By the server-clock age of the last heartbeat, judged as a reclaim judges
// it: stale (reclaimable by an instance with these thresholds) past the
// larger of the stale threshold and the one the holder stored; expired past
// the holder's stored threshold alone (its lease is over, its row is left
// over, but these thresholds do not reclaim it yet); alert at the alert
// threshold; else ok. A seed-made row stores no threshold: ours alone counts.
[[nodiscard]] LockState state_of(const LockRow& row, const ThresholdArgs& thresholds) noexcept;
// The heartbeat age past which an instance with these thresholds reclaims the row.
[[nodiscard]] double reclaim_after_s(const LockRow& row, const ThresholdArgs& thresholds) noexcept;
// The stale threshold the holder stored with its grant (0: none, a seed-made row).
[[nodiscard]] double holders_stale_s(const LockRow& row) noexcept;
[[nodiscard]] std::string_view to_string(LockState state) noexcept;
constexpr std::array<LockState, 4> all_values(LockState) {
  return {LockState::ok, LockState::alert, LockState::expired, LockState::stale};
}

[[nodiscard]] LockStatus status_of(const LockRow& row, const ThresholdArgs& thresholds, std::int64_t queue_length = 0);

// UTC, ISO 8601 with milliseconds: 2024-05-01T12:00:00.123Z
[[nodiscard]] std::string iso8601(std::chrono::system_clock::time_point when);

struct StatusReport {
  std::string table;
  std::optional<std::string> lock;  // asked about one lock
  ThresholdArgs thresholds{};
  std::vector<LockRow> rows;
  std::vector<QueuedWaiterRow> queue;  // by lock, then in queue order
  std::vector<ElectionRow> elections;  // by lock: every lock led now or before
};

// The report's elections, as `status` shows them.
[[nodiscard]] std::vector<LeaderStatus> leaders_of(const StatusReport& report);

// The report's waiters, positions counted per lock from 1.
[[nodiscard]] std::vector<WaiterStatus> waiters_of(const StatusReport& report);

// "pid 4242 on web-3: /opt/app/sync": what the holder's grant recorded (empty
// if nothing: a seed-made row), control characters escaped.
[[nodiscard]] std::string holder_where(const LockRow& row);

// "web-3-8f2a91c0 (pid 4242 on web-3: /opt/app/sync)": the instance and holder_where().
[[nodiscard]] std::string holder_text(const LockRow& row);

// Aligned columns, one lock per line, or one line saying nothing is held;
// then, if anyone waits, the queues: one waiter per line, in order; then, if
// any lock has an election, its leaders: one lock per line.
[[nodiscard]] std::string format_text(const StatusReport& report);

// {"table":..., "alert_threshold":..., "stale_threshold":..., "locks":[{...}], "queue":[{...}], "leaders":[{...}]}
[[nodiscard]] nlohmann::json to_json(const StatusReport& report);

// The Prometheus text exposition: pgmutex_lock_held, _heartbeat_age_seconds,
// _fence, _queue_length and _state{state="ok|alert|expired|stale"}, labelled
// with lock and instance; then each waiter's pgmutex_queue_waiter_* samples.
[[nodiscard]] std::string format_prometheus(const StatusReport& report);

}  // namespace pgmutex::cli
