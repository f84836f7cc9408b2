// What `pgmutex status` shows, as a table or as JSON (status_format.hpp).
#include "status_format.hpp"

#include <time.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <type_traits>

#include "pgmutex/describe/record.hpp"
#include "pgmutex/metrics/exposition.hpp"
#include "record_exposition.hpp"
#include "status_description.hpp"
#include "terminal_text.hpp"

namespace pgmutex::cli {
namespace {

std::string age_text(double seconds) {
  std::array<char, 32> buffer{};
  std::snprintf(buffer.data(), buffer.size(), "%.1fs", seconds);
  return buffer.data();
}

}  // namespace

double holders_stale_s(const LockRow& row) noexcept {
  return std::chrono::duration<double>(row.stale_threshold).count();
}

double reclaim_after_s(const LockRow& row, const ThresholdArgs& thresholds) noexcept {
  return std::max(thresholds.stale_s, holders_stale_s(row));
}

// The reclaim's own rule (an acquire takes a row whose heartbeat is older than
// the larger of its threshold and the one the holder stored), then the
// holder's own rule: past its stored threshold, its lease is over.
LockState state_of(const LockRow& row, const ThresholdArgs& thresholds) noexcept {
  const double age = row.seconds_since_heartbeat;
  if (age >= reclaim_after_s(row, thresholds)) return LockState::stale;
  if (holders_stale_s(row) > 0 && age >= holders_stale_s(row)) return LockState::expired;
  if (age >= thresholds.alert_s) return LockState::alert;
  return LockState::ok;
}

std::string_view to_string(LockState state) noexcept {
  switch (state) {
    case LockState::ok: return "ok";
    case LockState::alert: return "alert";
    case LockState::stale: return "stale";
    case LockState::expired: return "expired";
  }
  return "?";
}

std::string_view to_string(WaiterState state) noexcept {
  switch (state) {
    case WaiterState::waiting: return "waiting";
    case WaiterState::offered: return "offered";
    case WaiterState::dead: return "dead";
  }
  return "?";
}

std::string iso8601(std::chrono::system_clock::time_point when) {
  using namespace std::chrono;
  const auto whole = floor<seconds>(when);
  const auto millis = duration_cast<milliseconds>(when - whole).count();
  const time_t t = system_clock::to_time_t(whole);
  tm utc{};
  gmtime_r(&t, &utc);
  std::array<char, 40> buffer{};
  const std::size_t n = std::strftime(buffer.data(), buffer.size(), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(buffer.data() + n, buffer.size() - n, ".%03dZ", static_cast<int>(millis));
  return buffer.data();
}

std::string holder_where(const LockRow& row) {
  std::string where;
  if (row.holder_pid != 0) where = "pid " + std::to_string(row.holder_pid);
  if (!row.holder_host.empty()) where += (where.empty() ? "on " : " on ") + shown(row.holder_host);
  if (!row.holder_command.empty()) where += (where.empty() ? "" : ": ") + shown(row.holder_command);
  return where;
}

std::string holder_text(const LockRow& row) {
  const std::string where = holder_where(row);
  return where.empty() ? shown(row.instance_id) : shown(row.instance_id) + " (" + where + ")";
}

namespace {

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

// A value as the text table shows it: names escaped, ages in seconds with one decimal.
std::string text_of(const std::string& text) { return shown(text); }
std::string text_of(std::int64_t number) { return std::to_string(number); }
std::string text_of(bool yes) { return yes ? "yes" : "no"; }
std::string text_of(double seconds) { return age_text(seconds); }
std::string text_of(LockState state) { return std::string(to_string(state)); }
std::string text_of(WaiterState state) { return std::string(to_string(state)); }
std::string text_of(std::chrono::system_clock::time_point when) { return iso8601(when); }
template <class T>
std::string text_of(const std::optional<T>& value) {
  // Unrecorded details (a seed-made row) show as "-", so every line keeps its columns.
  return value ? text_of(*value) : "-";
}

// A value as JSON has it: the exact text; null for what was not recorded.
nlohmann::json json_of(const std::string& text) { return text; }
nlohmann::json json_of(std::int64_t number) { return number; }
nlohmann::json json_of(bool yes) { return yes; }
nlohmann::json json_of(double seconds) { return seconds; }
nlohmann::json json_of(LockState state) { return to_string(state); }
nlohmann::json json_of(WaiterState state) { return to_string(state); }
nlohmann::json json_of(std::chrono::system_clock::time_point when) { return iso8601(when); }
template <class T>
nlohmann::json json_of(const std::optional<T>& value) {
  return value ? json_of(*value) : nlohmann::json(nullptr);
}

std::string column_of(const describe::Field& field) {
  if (!field.column.empty()) return std::string(field.column);
  std::string column(describe::key_of(field));
  for (char& c : column) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return column;
}

// A described record's lines, aligned in columns under their headers.
template <class Record>
std::string aligned_text(const std::vector<Record>& records) {
  constexpr std::size_t columns = describe::field_count<Record>;
  std::vector<std::array<std::string, columns>> lines(1);
  for (std::size_t i = 0; i < columns; ++i) lines[0][i] = column_of(describe::Description<Record>::fields[i]);
  for (const Record& record : records) {
    auto& line = lines.emplace_back();
    std::size_t i = 0;
    describe::for_each_field(record, [&](const describe::Field&, const auto& value) { line[i++] = text_of(value); });
  }
  std::array<std::size_t, columns> width{};
  for (const auto& line : lines)
    for (std::size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], line[i].size());
  std::string text;
  for (const auto& line : lines) {
    for (std::size_t i = 0; i < line.size(); ++i) {
      text += line[i];
      if (i + 1 < line.size()) text.append(width[i] - line[i].size() + 2, ' ');
    }
    text += '\n';
  }
  return text;
}

// A described record as a JSON object, keyed as the description says.
template <class Record>
nlohmann::json json_object_of(const Record& record) {
  nlohmann::json object = nlohmann::json::object();
  describe::for_each_field(record, [&](const describe::Field& field, const auto& value) {
    object[std::string(describe::key_of(field))] = json_of(value);
  });
  return object;
}

std::int64_t queue_length_of(const StatusReport& report, const std::string& lock) {
  return std::ranges::count_if(report.queue, [&](const QueuedWaiterRow& w) { return w.lock_name == lock; });
}

std::vector<LockStatus> statuses_of(const StatusReport& report) {
  std::vector<LockStatus> statuses;
  for (const LockRow& row : report.rows)
    statuses.push_back(status_of(row, report.thresholds, queue_length_of(report, row.lock_name)));
  return statuses;
}

}  // namespace

std::vector<WaiterStatus> waiters_of(const StatusReport& report) {
  std::vector<WaiterStatus> waiters;
  std::int64_t position = 0;
  for (const QueuedWaiterRow& row : report.queue) {
    position = !waiters.empty() && waiters.back().lock == row.lock_name ? position + 1 : 1;
    WaiterStatus w;
    w.lock = row.lock_name;
    w.position = position;
    w.instance = row.instance_id;
    w.seconds_waiting = row.seconds_waiting;
    w.state = !row.alive ? WaiterState::dead : row.offered ? WaiterState::offered : WaiterState::waiting;
    if (!row.host.empty()) w.host = row.host;
    if (row.pid != 0) w.pid = row.pid;
    waiters.push_back(std::move(w));
  }
  return waiters;
}

std::vector<LeaderStatus> leaders_of(const StatusReport& report) {
  std::vector<LeaderStatus> leaders;
  for (const ElectionRow& row : report.elections) {
    LeaderStatus l;
    l.lock = row.lock_name;
    l.term = row.record.term;
    l.leading = row.record.leading();
    l.instance = row.record.instance_id;
    l.since = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::microseconds(row.record.since_us)));
    l.value = row.record.value;
    leaders.push_back(std::move(l));
  }
  return leaders;
}

LockStatus status_of(const LockRow& row, const ThresholdArgs& thresholds, std::int64_t queue_length) {
  LockStatus status;
  status.lock = row.lock_name;
  status.instance = row.instance_id;
  status.fence = row.fence;
  status.acquired_at = row.acquired_at;
  status.seconds_since_heartbeat = row.seconds_since_heartbeat;
  status.state = state_of(row, thresholds);
  if (!row.holder_host.empty()) status.host = row.holder_host;
  if (row.holder_pid != 0) status.pid = row.holder_pid;
  if (!row.holder_command.empty()) status.command = row.holder_command;
  status.queue_length = queue_length;
  return status;
}

std::string format_text(const StatusReport& report) {
  std::string text;
  if (report.rows.empty())
    text = report.lock ? "lock '" + shown(*report.lock) + "' is not held\n" : "no locks held in table " + report.table + "\n";
  else
    text = aligned_text(statuses_of(report));
  if (!report.queue.empty()) text += "\n" + aligned_text(waiters_of(report));
  if (!report.elections.empty()) text += "\n" + aligned_text(leaders_of(report));
  return text;
}

nlohmann::json to_json(const StatusReport& report) {
  auto locks = nlohmann::json::array();
  for (const LockStatus& status : statuses_of(report)) locks.push_back(json_object_of(status));
  auto queue = nlohmann::json::array();
  for (const WaiterStatus& waiter : waiters_of(report)) queue.push_back(json_object_of(waiter));
  auto leaders = nlohmann::json::array();
  for (const LeaderStatus& leader : leaders_of(report)) leaders.push_back(json_object_of(leader));
  return {{"table", report.table},
          {"alert_threshold", report.thresholds.alert_s},
          {"stale_threshold", report.thresholds.stale_s},
          {"locks", std::move(locks)},
          {"queue", std::move(queue)},
          {"leaders", std::move(leaders)}};
}

std::string format_prometheus(const StatusReport& report) {
  using Description = describe::Description<LockStatus>;
  const std::vector<LockStatus> statuses = statuses_of(report);

  std::string out;
  const describe::Field& held = Description::held;
  exposition::family(out, held.metric, held.metric_type, held.doc);
  for (const LockStatus& status : statuses) exposition::sample(out, held.metric, label_text(status), 1);
  if (statuses.empty() && report.lock)
    exposition::sample(out, held.metric, exposition::labels({{"lock", *report.lock}}), 0);

  write_metrics<LockStatus>(out, statuses);
  const std::vector<WaiterStatus> waiters = waiters_of(report);
  write_metrics<WaiterStatus>(out, waiters);
  return out;
}

}  // namespace pgmutex::cli
