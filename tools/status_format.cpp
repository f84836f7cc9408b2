#include "status_format.hpp"

#include <time.h>

#include <algorithm>
#include <array>
#include <cstdio>

#include "terminal_text.hpp"

namespace pgmutex::cli {
namespace {

std::string age_text(double seconds) {
  std::array<char, 32> buffer{};
  std::snprintf(buffer.data(), buffer.size(), "%.1fs", seconds);
  return buffer.data();
}

}  // namespace

LockState state_of(const LockRow& row, const ThresholdArgs& thresholds) noexcept {
  if (row.seconds_since_heartbeat >= thresholds.stale_s) return LockState::stale;
  if (row.seconds_since_heartbeat >= thresholds.alert_s) return LockState::alert;
  return LockState::ok;
}

std::string_view to_string(LockState state) noexcept {
  switch (state) {
    case LockState::ok: return "ok";
    case LockState::alert: return "alert";
    case LockState::stale: return "stale";
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

std::string format_text(const StatusReport& report) {
  if (report.rows.empty()) {
    if (report.lock) return "lock '" + shown(*report.lock) + "' is not held\n";
    return "no locks held in table " + report.table + "\n";
  }
  constexpr std::size_t columns = 9;
  const std::array<std::string, columns> header = {"LOCK",          "INSTANCE", "FENCE", "ACQUIRED_AT", "HEARTBEAT_AGE",
                                                   "STATE",         "HOST",     "PID",   "COMMAND"};
  std::vector<std::array<std::string, columns>> lines{header};
  // Unrecorded details (a seed-made row) show as "-", so every line keeps its columns.
  const auto or_dash = [](std::string text) { return text.empty() ? std::string("-") : text; };
  for (const LockRow& row : report.rows)
    lines.push_back({shown(row.lock_name), shown(row.instance_id), std::to_string(row.fence), iso8601(row.acquired_at),
                     age_text(row.seconds_since_heartbeat), std::string(to_string(state_of(row, report.thresholds))),
                     or_dash(shown(row.holder_host)), row.holder_pid != 0 ? std::to_string(row.holder_pid) : "-",
                     or_dash(shown(row.holder_command))});

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

nlohmann::json to_json(const StatusReport& report) {
  auto locks = nlohmann::json::array();
  for (const LockRow& row : report.rows)
    locks.push_back({{"lock", row.lock_name},
                     {"instance", row.instance_id},
                     {"fence", row.fence},
                     {"acquired_at", iso8601(row.acquired_at)},
                     {"seconds_since_heartbeat", row.seconds_since_heartbeat},
                     {"state", to_string(state_of(row, report.thresholds))},
                     // null: not recorded (a seed-made row, or a holder that did not say)
                     {"host", row.holder_host.empty() ? nlohmann::json(nullptr) : nlohmann::json(row.holder_host)},
                     {"pid", row.holder_pid == 0 ? nlohmann::json(nullptr) : nlohmann::json(row.holder_pid)},
                     {"command", row.holder_command.empty() ? nlohmann::json(nullptr) : nlohmann::json(row.holder_command)}});
  return {{"table", report.table},
          {"alert_threshold", report.thresholds.alert_s},
          {"stale_threshold", report.thresholds.stale_s},
          {"locks", std::move(locks)}};
}

}  // namespace pgmutex::cli
