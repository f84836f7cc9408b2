// The session's batched heartbeats: every heartbeat asked for within one
// tick goes out at its end as one heartbeat_many statement per lock table,
// and each caller's callback gets its own key's answer.
#include <algorithm>
#include <map>

#include "session_core.hpp"

namespace pgmutex::postgres_detail {
namespace {

Error not_held(const HolderKey& key) {
  return Error(Errc::lock_not_held, "lock '" + std::string(key.lock.lock_name) + "' has no row for instance '" +
                                        std::string(key.instance_id) + "' with fence " + std::to_string(key.fence) +
                                        " and this grant's token");
}

}  // namespace

bool SessionCore::add_beat(Beat beat) {
  bool sooner = false;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return false;  // never sent: its callback must not be kept unrun
    // The tick starts with its first heartbeat, so a lone one waits one tick
    // at most; and no beat waits more than half its own time, so the
    // statement keeps the other half: a heartbeat timeout at or below the
    // tick shortens the tick instead of failing every beat unsent.
    const auto now = std::chrono::steady_clock::now();
    const auto send_by = now + std::min(options_.heartbeat_tick,
                                        std::max(beat.deadline - now, std::chrono::nanoseconds::zero()) / 2);
    if (!tick_end_ || send_by < *tick_end_) {
      tick_end_ = send_by;
      sooner = true;
    }
    beats_.push_back(std::move(beat));
    // The I/O thread's timer changed. Under the lock: the beat's callback
    // may own the session's last share (session_core.cpp, run_job).
    if (sooner) wake();
  }
  return true;
}

// One table's keys: first in one statement that skips rows another
// transaction has locked (so one foreign row lock never fails the heartbeats
// of every other lock in the table), then the keys it did not find, if any,
// in one statement that waits for their rows (within its lock_timeout): a
// locked row then fails its own key with a timeout, a row that is gone
// answers lock_not_held.
std::vector<std::optional<Error>> SessionCore::send(std::span<const HolderKey> keys, bool durable) {
  std::vector<std::optional<Error>> out(keys.size());
  auto held = SharedAccess::heartbeat_many(*io_backend_, keys, durable, true);
  ++heartbeat_statements_;
  heartbeats_ += keys.size();
  if (!held) {
    std::fill(out.begin(), out.end(), held.error());
    return out;
  }
  std::vector<HolderKey> missed;
  std::vector<std::size_t> where;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (!(*held)[i]) {
      missed.push_back(keys[i]);
      where.push_back(i);
    }
  if (missed.empty()) return out;
  auto again = SharedAccess::heartbeat_many(*io_backend_, missed, durable, false);
  ++heartbeat_statements_;
  for (std::size_t k = 0; k < where.size(); ++k) {
    if (!again) out[where[k]] = again.error();
    else if (!(*again)[k]) out[where[k]] = not_held(missed[k]);
  }
  return out;
}

void SessionCore::send_beats() {
  std::vector<Beat> batch;
  {
    std::lock_guard lock(mutex_);
    batch.swap(beats_);
    tick_end_.reset();
  }
  std::vector<BeatReply> replies(batch.size());
  const auto now = std::chrono::steady_clock::now();
  // Heartbeats that waited past their deadline (behind a hung statement) fail unsent.
  std::map<std::string, std::vector<std::size_t>> by_table;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].deadline <= now)
      replies[i].result = fail(Errc::backend_unavailable,
                               "heartbeat of lock '" + batch[i].lock_name +
                                   "': the session's connection was busy until the deadline");
    else
      by_table[batch[i].table].push_back(i);
  }
  for (const auto& [table, index] : by_table) {
    // Connected first, so that the history the durability is judged on is
    // the one the statement runs on.
    if (auto connected = io_backend_->connect(); !connected) {
      for (std::size_t i : index) replies[i].result = tl::unexpected(connected.error());
      continue;
    }
    const std::uint64_t history = own_.history().history();
    bool durable = false;
    std::vector<HolderKey> keys;
    keys.reserve(index.size());
    const auto started = std::chrono::steady_clock::now();
    for (std::size_t i : index) {
      const Beat& b = batch[i];
      durable = durable || b.durable || (b.mark && b.mark->due(history));
      keys.push_back(HolderKey{{b.table, b.lock_name}, b.instance_id, b.fence, b.token,
                               std::max(b.deadline - started, std::chrono::nanoseconds(1))});
    }
    auto answers = send(keys, durable);
    const bool any_beaten = std::any_of(answers.begin(), answers.end(), [](const auto& a) { return !a; });
    if (any_beaten && !durable && io_backend_->history() != history) {
      // A reconnect inside reached a new history: the first heartbeat there must be durable.
      durable = true;
      answers = send(keys, true);
    }
    const std::uint64_t session = io_backend_->session();
    const std::uint64_t ran_on = io_backend_->history();
    HeartbeatDurability durability = io_backend_->last_heartbeat_durability();
    durability.durable = durability.durable || durable;
    for (std::size_t k = 0; k < index.size(); ++k) {
      BeatReply& reply = replies[index[k]];
      const Beat& b = batch[index[k]];
      reply.session = session;
      reply.history = ran_on;
      reply.durability = durability;
      if (answers[k]) reply.result = tl::unexpected(std::move(*answers[k]));
      else if (durable && b.mark) b.mark->history = ran_on;  // committed synchronously: durable for this mutex
    }
  }
  note_counts();
  // No lock held: a callback may ask for the next heartbeat at once.
  for (std::size_t i = 0; i < batch.size(); ++i) batch[i].done(std::move(replies[i]));
}

}  // namespace pgmutex::postgres_detail
