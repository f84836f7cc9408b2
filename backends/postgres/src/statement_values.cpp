// Writing statement parameters and reading result rows (statement_values.hpp).
#include "statement_values.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace pgmutex::postgres_detail {
namespace {

GrantToken token_of(const std::string& text) {
  return std::bit_cast<GrantToken>(static_cast<std::int64_t>(std::strtoll(text.c_str(), nullptr, 10)));
}
Fence fence_of(const std::string& text) { return static_cast<Fence>(std::strtoll(text.c_str(), nullptr, 10)); }
double double_of(const std::string& text) { return std::strtod(text.c_str(), nullptr); }

}  // namespace

std::string text_array(const std::vector<std::string_view>& items) {
  std::string out = "{";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out.push_back(',');
    out.push_back('"');
    for (char c : items[i]) {
      if (c == '"' || c == '\\') out.push_back('\\');
      out.push_back(c);
    }
    out.push_back('"');
  }
  out.push_back('}');
  return out;
}

std::string seconds_param(std::chrono::nanoseconds d) {
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, "%.9f", std::chrono::duration<double>(d).count());
  return buffer;
}

std::string token_param(GrantToken token) { return std::to_string(std::bit_cast<std::int64_t>(token)); }

LockRow row_from(const Rows& rows, std::size_t r) {
  LockRow out;
  out.lock_name = rows.text(r, 0);
  out.instance_id = rows.text(r, 1);
  out.fence = fence_of(rows.text(r, 2));
  out.acquired_at = std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::microseconds(std::strtoll(rows.text(r, 3).c_str(), nullptr, 10))));
  out.seconds_since_heartbeat = double_of(rows.text(r, 4));
  out.token = token_of(rows.text(r, 5));
  out.stale_threshold = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(double_of(rows.text(r, 6))));
  out.holder_host = rows.text(r, 7);
  out.holder_pid = std::strtoll(rows.text(r, 8).c_str(), nullptr, 10);
  out.holder_command = rows.text(r, 9);
  return out;
}

QueuedWaiterRow waiter_from(const Rows& rows, std::size_t r) {
  QueuedWaiterRow out;
  out.lock_name = rows.text(r, 0);
  out.ticket = std::strtoll(rows.text(r, 1).c_str(), nullptr, 10);
  out.instance_id = rows.text(r, 2);
  out.host = rows.text(r, 3);
  out.pid = std::strtoll(rows.text(r, 4).c_str(), nullptr, 10);
  out.seconds_waiting = double_of(rows.text(r, 5));
  out.offered = rows.text(r, 6) == "t";
  out.alive = rows.text(r, 7) == "t";
  return out;
}

AcquireResult read_acquire(const Rows& rows, bool& raced) {
  AcquireResult out;
  raced = false;
  const bool seen = !rows.is_null(0, 2);
  if (seen) {
    out.holder = rows.text(0, 2);
    out.fence = fence_of(rows.text(0, 3));
    out.holder_age_s = double_of(rows.text(0, 4));
    out.holder_token = token_of(rows.text(0, 5));
  }
  if (!rows.is_null(0, 0)) {
    AcquireResult won;
    won.acquired = true;
    won.fence = fence_of(rows.text(0, 0));
    return won;
  }
  if (!rows.is_null(0, 1)) {
    out.acquired = true;
    out.reclaimed = true;
    out.fence = fence_of(rows.text(0, 1));
    out.holder_token = 0;
    return out;
  }
  // Free or stale, but a failover grace runs: nobody may take it yet.
  if ((!seen || rows.text(0, 6) == "t") && !rows.is_null(0, 7)) {
    if (const double left = double_of(rows.text(0, 7)); left > 0) {
      AcquireResult grace;
      grace.holder = std::string(failover_grace_holder);
      grace.failover_grace_left_s = left;
      return grace;
    }
  }
  // Lost. If the row we saw was live, it names the holder as of now. If we
  // saw none (a rival's insert won under our snapshot) or a stale one that
  // another reclaimer took (or its holder released) meanwhile, the holder
  // we saw is gone or unknown: the caller tries again with a fresh snapshot.
  raced = !seen || rows.text(0, 6) == "t";
  // Lost to the queue (a live waiter): nothing raced, the answer stands.
  if (rows.rows.at(0).size() > 8 && !rows.is_null(0, 8) && rows.text(0, 8) == "t") raced = false;
  return out;
}

AcquireResult read_confirmed_offer(const Rows& rows) {
  AcquireResult out;
  if (rows.is_null(0, 0)) return out;
  out.acquired = true;
  out.fence = fence_of(rows.text(0, 0));
  // Committed unflushed: how long the offer it confirmed may stand at least (queue_sql.cpp).
  // Never 0 (which says durable): the statement asks for 1 ms left at least.
  if (!rows.is_null(0, 2))
    out.provisional_for = std::max<std::chrono::nanoseconds>(std::chrono::milliseconds(std::stoll(rows.text(0, 2))),
                                                             std::chrono::nanoseconds(1));
  return out;
}

AcquireResult read_queued_acquire(const Rows& rows) {
  AcquireResult out;
  if (!rows.is_null(0, 0)) {  // confirmed: the row carried our token
    out.acquired = true;
    out.fence = fence_of(rows.text(0, 0));
    return out;
  }
  const bool seen = !rows.is_null(0, 3);
  if (!rows.is_null(0, 1)) {  // first in line when the lock was available: ours
    out.acquired = true;
    out.fence = fence_of(rows.text(0, 1));
    if (seen && rows.text(0, 7) == "t") {
      out.reclaimed = true;
      out.holder = rows.text(0, 3);
      out.holder_age_s = double_of(rows.text(0, 5));
    }
    return out;
  }
  if (seen) {
    out.holder = rows.text(0, 3);
    out.fence = fence_of(rows.text(0, 4));
    out.holder_age_s = double_of(rows.text(0, 5));
    out.holder_token = token_of(rows.text(0, 6));
  }
  if (rows.text(0, 2) == "t") {
    out.queue_place_lost = true;
    return out;
  }
  if (!rows.is_null(0, 9)) {  // offered to the head: it holds, as of now
    out.holder = rows.text(0, 10);
    out.fence = fence_of(rows.text(0, 9));
    out.holder_age_s = 0;
    out.holder_token = 0;
    return out;
  }
  if ((!seen || rows.text(0, 7) == "t") && !rows.is_null(0, 8)) {
    if (const double left = double_of(rows.text(0, 8)); left > 0) {
      AcquireResult grace;
      grace.holder = std::string(failover_grace_holder);
      grace.failover_grace_left_s = left;
      return grace;
    }
  }
  return out;
}

std::vector<bool> keys_beaten(const Rows& rows, std::size_t keys) {
  std::vector<bool> out(keys, false);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto at = std::strtoull(rows.text(r, 0).c_str(), nullptr, 10);  // 1-based
    if (at >= 1 && at <= out.size()) out[at - 1] = true;
  }
  return out;
}

HeartbeatDurability durability_of(const Rows& rows, bool synchronous, std::size_t first) {
  if (synchronous) return HeartbeatDurability{true, 0, 0};
  HeartbeatDurability d;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const std::uint64_t before = std::strtoull(rows.text(r, first).c_str(), nullptr, 10);
    const std::uint64_t flushed = std::strtoull(rows.text(r, first + 1).c_str(), nullptr, 10);
    d.wal_before = std::max(d.wal_before, before);
    d.wal_flushed = r == 0 ? flushed : std::min(d.wal_flushed, flushed);
  }
  if (d.wal_before == 0) d.wal_flushed = 0;
  return d;
}

}  // namespace pgmutex::postgres_detail
