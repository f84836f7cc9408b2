// MemoryBackend: one instance's connection to a MemoryServer, and the Backend
// policy over it: each operation waits out injected latency and hangs, asks
// the server which fault it meets, then reads and writes the rows.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pgmutex/backend.hpp"
#include "pgmutex/detail/light_mutex.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/memory/same_text.hpp"
#include "pgmutex/memory/server.hpp"
#include "pgmutex/memory/waiter_queue.hpp"
#include "pgmutex/options.hpp"

namespace pgmutex {

class MemoryBackend {
 public:
  // `connection` names this connection for partition() and drop_connection().
  explicit MemoryBackend(std::shared_ptr<MemoryServer> server, std::string connection = "default")
      : server_(std::move(server)), connection_(std::move(connection)) {}

  [[nodiscard]] const std::shared_ptr<MemoryServer>& server() const noexcept { return server_; }

  // Another client on the same server and connection name, for another lock
  // of a mutex's (BackendShares): it reads only what never changes once set
  // up, never this one's cache or last answers, which a heartbeat of its
  // mutex may be writing meanwhile on another thread.
  [[nodiscard]] MemoryBackend share() const {
    MemoryBackend other(server_, connection_);
    other.statement_timeout_ = statement_timeout_;
    return other;
  }

  // Whether an acknowledged heartbeat may still be lost (see
  // MemoryServer::set_asynchronous_heartbeats): the mutex keeps a heartbeat
  // interval more of margin then.
  [[nodiscard]] bool heartbeat_commits_asynchronously() const noexcept { return server_->asynchronous_heartbeats(); }

  // The server session: every connection gets a new one when the server restarts.
  [[nodiscard]] std::uint64_t session() const noexcept {
    return server_->restarts_.load(std::memory_order_relaxed);
  }

  // The server history: another after each MemoryServer::fail_over().
  [[nodiscard]] std::uint64_t history() const noexcept { return server_->history_.load(std::memory_order_relaxed); }

  // The timeout of statements that carry none (inspect, list, force_release)
  // while their connection hangs (default 30 s). Zero: none.
  void set_statement_timeout(std::chrono::nanoseconds timeout) noexcept { statement_timeout_ = timeout; }

  Result<void> create_schema(std::string_view table) noexcept {
    if (auto valid = validate_table_name(table); !valid) return valid;
    server_->delay();
    detail::LightLock lock(server_->mutex_);
    if (auto error = server_->admit(connection_)) return tl::unexpected(std::move(*error));
    if (std::string key = MemoryServer::table_key(table); !server_->tables_.contains(key))
      server_->tables_.emplace(std::move(key), MemoryServer::Table{});
    return {};
  }

  Result<AcquireResult> try_acquire(const AcquireRequest& request) noexcept {
    server_->delay();
    Result<AcquireResult> out;  // built in place and returned by name: no moves of the holder string
    if (auto hung = server_->any_hung() ? server_->wait_if_hung(connection_, request.timeout) : std::nullopt) [[unlikely]] {
      out = tl::unexpected(std::move(*hung));
      return out;
    }
    detail::LightLock lock(server_->mutex_);
    if (auto error = server_->admit(connection_)) {
      out = tl::unexpected(std::move(*error));
      return out;
    }
    Place found = place_for(request.lock);
    if (found.row == nullptr) [[unlikely]] {
      out = tl::unexpected(table_error(request.lock));
      return out;
    }
    MemoryServer::Row& row = *found.row;
    const auto now = server_->now();

    AcquireResult& result = *out;
    // After a failover, the grace (see MemoryServer::set_failover_grace).
    const std::uint64_t history = server_->history_.load(std::memory_order_relaxed);
    double grace_left = 0;
    if (history != 0) [[unlikely]]
      grace_left = server_->failover_grace_left(*found.table, history, request.stale_threshold, now);
    // A queued try, or a table where someone waits in line: the queue's rules.
    if ((request.queue_ticket | static_cast<std::int64_t>(found.table->waiting)) != 0) [[unlikely]] {
      try_in_line(request, found, history, grace_left, now, result);
      if (server_->reply_lost()) out = fail(Errc::outcome_unknown, "reply lost after commit");
      return out;
    }
    // Stale past the larger of our threshold and the holder's: a client with
    // a shorter one cannot take a lock from a holder that keeps a longer one.
    if (row.present && !(row.last_heartbeat < now - std::max(request.stale_threshold, row.stale_threshold))) {
      result.fence = row.fence;
      result.holder = row.instance_id;
      result.holder_age_s = server_->age_seconds(row);
      result.holder_token = row.token;
    } else if (grace_left > 0) [[unlikely]] {
      result.holder.assign(failover_grace_holder);
      result.failover_grace_left_s = grace_left;
    } else {
      if (row.present) {
        result.reclaimed = true;
        result.holder = row.instance_id;
        result.holder_age_s = server_->age_seconds(row);
      }
      grant(row, *found.table, history, request.lock.identity, request.instance_id, request.token,
            request.stale_threshold, request.holder_details.host, request.holder_details.pid,
            request.holder_details.command, now);
      result.acquired = true;
      result.fence = row.fence;
    }
    if (server_->reply_lost()) out = fail(Errc::outcome_unknown, "reply lost after commit");
    return out;
  }

  // A campaign's try (BackendElectsInOneStatement): the rules of a try, and
  // a grant it makes or confirms for itself announced under the same hold of
  // the server (one transaction). It takes the queue's path (try_in_line),
  // whose rules a plain try follows too when someone waits, so that the
  // mutex's own path above stays as it was.
  Result<AcquireResult> try_acquire(const AcquireRequest& request, GrantAnnouncement& announcement) noexcept {
    announcement.announced = false;
    if (auto valid = validate_election_value(request.lock.lock_name, announcement.value); !valid)
      return tl::unexpected(valid.error());
    server_->delay();
    if (auto hung = server_->any_hung() ? server_->wait_if_hung(connection_, request.timeout) : std::nullopt)
      return tl::unexpected(std::move(*hung));
    detail::LightLock lock(server_->mutex_);
    if (auto error = server_->admit(connection_)) return tl::unexpected(std::move(*error));
    auto found = row_for(request.lock);
    if (!found) return tl::unexpected(std::move(found.error()));
    const auto now = server_->now();
    const std::uint64_t history = server_->history_.load(std::memory_order_relaxed);
    const double grace_left =
        history != 0 ? server_->failover_grace_left(*found->table, history, request.stale_threshold, now) : 0;
    AcquireResult result;
    try_in_line(request, *found, history, grace_left, now, result);
    if (result.acquired) announce_grant(*found->row, *found->table, request.lock.lock_name, announcement);
    if (server_->reply_lost()) return fail(Errc::outcome_unknown, "reply lost after commit");
    return result;
  }

 private:
  // The grant just made (or confirmed) in `row` announces the campaign's
  // value as its term's, as announce() would: a higher term is elected; a
  // term the record already shows at or above it changes nothing, and the
  // answer says it was not announced.
  void announce_grant(const MemoryServer::Row& row, MemoryServer::Table& table, std::string_view lock_name,
                      GrantAnnouncement& announcement) {
    auto& e = table.elections.try_emplace(std::string(lock_name)).first->second;
    if (detail::announce_term(e, row.fence, announcement.value, row.instance_id, row.holder_host, server_->now()))
      server_->flush();
    announcement.announced = e.term == row.fence && e.announced;
  }

 public:
  Result<void> heartbeat(const HolderKey& key) noexcept {
    last_durability_ = {};
    return on_holder_row(key, [&](MemoryServer::Row& row, MemoryServer::Table&) {
      // The first heartbeat after a failover is durable (BackendReportsHistory),
      // and one the mutex asks to be (HolderKey::durable).
      const std::uint64_t history = server_->history_.load(std::memory_order_relaxed);
      const bool durable = key.durable || beat_history_ != history;
      last_durability_ = server_->wal_now(durable);
      server_->beat(row);
      if (durable) {
        server_->flush();  // a synchronous commit flushes every earlier one
        MemoryServer::made_durable(row);
        beat_history_ = history;
      }
    });
  }

  // How the last heartbeat (or heartbeat_many) was committed: see
  // BackendReportsDurability and MemoryServer::set_asynchronous_heartbeats.
  [[nodiscard]] HeartbeatDurability last_heartbeat_durability() const noexcept { return last_durability_; }

  // With someone in line for the lock, the row goes to the first live
  // waiter as an offer (one wake-up); else it is deleted.
  Result<void> release(const HolderKey& key) noexcept {
    return on_holder_row(key, [&](MemoryServer::Row& row, MemoryServer::Table& table) {
      if (table.waiting != 0) [[unlikely]]
        return hand_off(row, table, key.lock);
      row.present = false;
      server_->flush();
    });
  }

  // A leadership's resign (BackendElectsInOneStatement): release(), and
  // the grant's term vacated if announced, under one hold of the server.
  Result<void> release_vacating(const HolderKey& key) noexcept {
    return on_holder_row(key, [&](MemoryServer::Row& row, MemoryServer::Table& table) {
      if (const auto e = table.elections.find(key.lock.lock_name); e != table.elections.end())
        (void)detail::vacate_term(e->second, key.fence);
      if (table.waiting != 0) return hand_off(row, table, key.lock);
      row.present = false;
      server_->flush();
    });
  }

  Result<std::vector<bool>> heartbeat_many(std::span<const HolderKey> keys) noexcept {
    server_->delay();
    if (auto hung = server_->any_hung() ? server_->wait_if_hung(connection_, keys.empty() ? std::chrono::nanoseconds{} : keys[0].timeout) : std::nullopt)
      return tl::unexpected(std::move(*hung));
    detail::LightLock lock(server_->mutex_);
    if (auto error = server_->admit(connection_)) return tl::unexpected(std::move(*error));
    std::vector<bool> held;
    held.reserve(keys.size());
    const bool durable = std::any_of(keys.begin(), keys.end(), [](const HolderKey& k) { return k.durable; });
    last_durability_ = server_->wal_now(durable);
    for (const HolderKey& key : keys) {
      auto found = row_for(key.lock);
      if (!found) return tl::unexpected(std::move(found.error()));
      MemoryServer::Row* row = holder_row(*found->row, key);
      if (row != nullptr) server_->beat(*row);
      held.push_back(row != nullptr);
    }
    if (durable) server_->flush();
    if (server_->reply_lost()) return fail(Errc::outcome_unknown, "reply lost after commit");
    return held;
  }

  Result<std::optional<LockRow>> inspect(LockRef lock_ref) noexcept {
    return on_present_row(lock_ref, [](MemoryServer::Row&, MemoryServer::Table&) {});
  }

  Result<std::vector<LockRow>> list(std::string_view table_name) noexcept {
    server_->delay();
    if (auto hung = server_->any_hung() ? server_->wait_if_hung(connection_, statement_timeout_) : std::nullopt) return tl::unexpected(std::move(*hung));
    detail::LightLock lock(server_->mutex_);
    if (auto error = server_->admit(connection_)) return tl::unexpected(std::move(*error));
    auto table = server_->table(table_name);
    if (!table) return tl::unexpected(table.error());
    std::vector<LockRow> rows;
    for (const auto& [name, row] : (*table)->rows)
      if (row.present) rows.push_back(server_->to_row(name, row));
    std::ranges::sort(rows, {}, &LockRow::lock_name);
    return rows;
  }

  // An administrator's release: hands off to the line as release() does.
  Result<std::optional<LockRow>> force_release(LockRef lock_ref) noexcept {
    return on_present_row(lock_ref, [&](MemoryServer::Row& row, MemoryServer::Table& table) {
      if (table.waiting != 0) return hand_off(row, table, lock_ref);
      row.present = false;
    });
  }

  // ---- elections (BackendKeepsElections; memory/elections.hpp) -----------

  Result<LeaderRecord> leader(LockRef lock_ref, std::chrono::nanoseconds stale_threshold) noexcept {
    server_->delay();
    if (auto hung = server_->any_hung() ? server_->wait_if_hung(connection_, statement_timeout_) : std::nullopt)
      return tl::unexpected(std::move(*hung));
    detail::LightLock lock(server_->mutex_);
    if (auto error = server_->admit(connection_)) return tl::unexpected(std::move(*error));
    auto table = server_->table(lock_ref.table);
    if (!table) return tl::unexpected(table.error());
    LeaderRecord out;
    if (const auto e = (*table)->elections.find(lock_ref.lock_name); e != (*table)->elections.end())
      out = record_of(e->second);
    if (const auto r = (*table)->rows.find(lock_ref.lock_name); r != (*table)->rows.end() && r->second.present) {
      out.lock_fence = r->second.fence;
      out.seconds_since_heartbeat = server_->age_seconds(r->second);
      const auto stale_after = std::max(stale_threshold, r->second.stale_threshold);
      out.lock_live = r->second.last_heartbeat >= server_->now() - stale_after;
      out.stale_after_s = std::chrono::duration<double>(stale_after).count();
    }
    return out;
  }

  Result<LeaderRecord> announce(const HolderKey& key, std::string_view value) noexcept {
    if (auto valid = validate_election_value(key.lock.lock_name, value); !valid) return tl::unexpected(valid.error());
    LeaderRecord out;
    bool held = false;
    auto done = on_holder_row(key, [&](MemoryServer::Row& row, MemoryServer::Table& table) {
      // Only while the row is live by its holder's own threshold
      // (election_sql.cpp's holder_row): else the key holds nothing.
      if (row.last_heartbeat < server_->now() - row.stale_threshold) return;
      held = true;
      auto& e = table.elections.try_emplace(std::string(key.lock.lock_name)).first->second;
      if (detail::announce_term(e, row.fence, value, row.instance_id, row.holder_host, server_->now())) server_->flush();
      out = record_of(e);
    });
    if (auto refused = not_holding(done, key, "announce")) return *refused;
    if (!held || out.term != key.fence || !out.announced) return term_refused(key, "announce", held, out);
    out.lock_fence = key.fence;
    out.lock_live = true;
    return out;
  }

  // As Postgres's UPDATE: an entry only where one exists (review finding
  // 10), never one made for a lock that was never announced.
  Result<LeaderRecord> vacate(const HolderKey& key) noexcept {
    LeaderRecord out;
    auto done = on_holder_row(key, [&](MemoryServer::Row&, MemoryServer::Table& table) {
      const auto e = table.elections.find(key.lock.lock_name);
      if (e == table.elections.end()) return;
      if (detail::vacate_term(e->second, key.fence)) server_->flush();
      out = record_of(e->second);
    });
    if (auto refused = not_holding(done, key, "vacate")) return *refused;
    out.lock_fence = key.fence;
    out.lock_live = true;
    return out;
  }

  // ---- the queue (BackendQueuesWaiters, BackendPollsQueue) ----------------

  // A place at the back of the lock's line, with request.token as the waiter token.
  Result<QueuePlace> enqueue(const AcquireRequest& request, std::chrono::nanoseconds handoff_deadline) noexcept {
    server_->delay();
    if (auto hung = server_->any_hung() ? server_->wait_if_hung(connection_, request.timeout) : std::nullopt)
      return tl::unexpected(std::move(*hung));
    detail::LightLock lock(server_->mutex_);
    if (auto error = server_->admit(connection_)) return tl::unexpected(std::move(*error));
    auto found = row_for(request.lock);
    if (!found) return tl::unexpected(std::move(found.error()));
    MemoryServer::Table& table = *found->table;
    detail::WaiterQueue& line = queue_of(table, request.lock.lock_name);
    QueuePlace place;
    place.ticket = ++table.last_ticket;
    place.ahead = static_cast<std::int64_t>(line.waiters.size());
    place.try_now = available(*found->row, line, request.stale_threshold, server_->now());
    line.waiters.push_back(detail::Waiter{place.ticket, request.token, std::string(request.instance_id), connection_,
                                          request.stale_threshold, handoff_deadline,
                                          std::string(request.holder_details.host), request.holder_details.pid,
                                          std::string(request.holder_details.command), 0, {}, line.freed});
    ++table.waiting;
    if (server_->reply_lost()) return fail(Errc::outcome_unknown, "reply lost after commit");
    return place;
  }

  // Leaves the line; an offer made to this place meanwhile is passed on, as a release.
  Result<void> dequeue(const AcquireRequest& request, std::int64_t ticket) noexcept {
    server_->delay();
    if (auto hung = server_->any_hung() ? server_->wait_if_hung(connection_, request.timeout) : std::nullopt)
      return tl::unexpected(std::move(*hung));
    detail::LightLock lock(server_->mutex_);
    if (auto error = server_->admit(connection_)) return tl::unexpected(std::move(*error));
    auto found = row_for(request.lock);
    if (!found) return tl::unexpected(std::move(found.error()));
    MemoryServer::Table& table = *found->table;
    MemoryServer::Row& row = *found->row;
    detail::WaiterQueue& line = queue_of(table, request.lock.lock_name);
    if (detail::Waiter* me = line.find(ticket); me != nullptr && me->token == request.token) {
      if (me->offered_fence != 0 && row.present && row.fence == me->offered_fence && row.token == me->token)
        hand_off(row, table, request.lock);  // sweeps our place with the offer
      else
        table.waiting -= line.remove_if([&](const detail::Waiter& w) { return w.ticket == ticket; });
    }
    if (server_->reply_lost()) return fail(Errc::outcome_unknown, "reply lost after commit");
    return {};
  }

  // Whether the waiter with `ticket` should wake, from what the server
  // holds: no operation (the core sleeps between looks). turn: offered the
  // lock; look: a '' wake-up came, or the lock is available (free, stale, or
  // an offer that lapsed) and the waiter is first in line (the runner-up too
  // for a free or stale row), or the place is gone. A killed connection hears nothing.
  std::optional<QueueWake> queue_wake(const WatchRequest& w, std::int64_t ticket) noexcept {
    detail::LightLock lock(server_->mutex_);
    if (server_->faults_.killed(connection_)) return std::nullopt;
    auto found = row_for(w.lock);
    if (!found) return QueueWake::look;
    detail::WaiterQueue& line = queue_of(*found->table, w.lock.lock_name);
    detail::Waiter* me = line.find(ticket);
    if (me == nullptr) return QueueWake::look;  // the queued try says why
    if (me->offered_fence != 0) return QueueWake::turn;
    if (me->seen_freed != line.freed) {
      me->seen_freed = line.freed;
      return QueueWake::look;
    }
    const MemoryServer::Row& row = *found->row;
    const auto alive = [&](const detail::Waiter& x) { return server_->alive(x); };
    const bool first = line.live(alive, 0) == me;
    if (!first && line.live(alive, 1) != me) return std::nullopt;
    const auto now = server_->now();
    if (!row.present || row.last_heartbeat < now - std::max(w.stale_threshold, row.stale_threshold))
      return QueueWake::look;  // the runner-up too: the head may be a place nobody waits in any more
    if (first && available(row, line, w.stale_threshold, now)) return QueueWake::look;  // a lapsed offer
    return std::nullopt;
  }

 private:
  // The row this holder owns, or nullptr if it was released or granted again.
  // Granted by the same mutex (LockRef::identity), its instance id is the key's.
  PGMUTEX_ALWAYS_INLINE static MemoryServer::Row* holder_row(MemoryServer::Row& row, const HolderKey& key) noexcept {
    if (!row.present || row.fence != key.fence || row.token != key.token) return nullptr;
    if (key.lock.identity != 0 && row.holder_identity == key.lock.identity) [[likely]]
      return &row;
    return detail::same_text(row.instance_id, key.instance_id) ? &row : nullptr;
  }

  // The row of a lock, made (absent) if new. Rows and tables are never erased
  // and map nodes never move, so the last one looked up is kept: a mutex asks
  // for one lock, again and again.
  struct Place {
    MemoryServer::Table* table = nullptr;
    MemoryServer::Row* row = nullptr;
  };
  PGMUTEX_ALWAYS_INLINE Result<Place> row_for(const LockRef& lock) {
    const Place place = place_for(lock);
    if (place.row == nullptr) [[unlikely]]
      return tl::unexpected(table_error(lock));
    return place;
  }
  // row_for() for a plain try and every statement on a holder's row: no
  // Result to build and check. {} if the lock's table is missing
  // (table_error() says so).
  // The cache is kept by the mutex's identity (LockRef: the same one always
  // names the same lock) or by contents, never by the address of the
  // caller's strings: those may be temporaries that a later call's strings reuse.
  PGMUTEX_ALWAYS_INLINE Place place_for(const LockRef& lock) {
    if (cached_.row != nullptr) [[likely]] {
      if (lock.identity != 0 && lock.identity == cached_identity_) [[likely]]
        return cached_;
      if (detail::same_text(cached_lock_, lock.lock_name) && detail::same_text(cached_table_, lock.table)) {
        cached_identity_ = lock.identity;  // the contents matched: this identity names them
        return cached_;
      }
    }
    return find_place(lock);
  }
  PGMUTEX_NOINLINE Place find_place(const LockRef& lock) {
    auto table = server_->table(lock.table);
    if (!table) return {};
    auto found = (*table)->rows.find(lock.lock_name);
    if (found == (*table)->rows.end())
      found = (*table)->rows.emplace(std::string(lock.lock_name), MemoryServer::Row{}).first;
    cached_table_.assign(lock.table);
    cached_lock_.assign(lock.lock_name);
    cached_ = Place{*table, &found->second};
    cached_identity_ = lock.identity;
    return cached_;
  }
  // Why place_for() found no row: the lock's table is missing. Asked in the
  // same hold of the server's mutex as that place_for(), so the table is
  // still missing (the first branch is not reached; it names the case anyway).
  PGMUTEX_NOINLINE Error table_error(const LockRef& lock) {
    auto table = server_->table(lock.table);
    return table ? Error(Errc::backend_error, "table '" + std::string(lock.table) + "' has no row")
                 : std::move(table.error());
  }

  // The lock's row as it was before `change`, if anyone holds it.
  template <class Change>
  Result<std::optional<LockRow>> on_present_row(LockRef lock_ref, Change change) noexcept {
    server_->delay();
    if (auto hung = server_->any_hung() ? server_->wait_if_hung(connection_, statement_timeout_) : std::nullopt) [[unlikely]]
      return tl::unexpected(std::move(*hung));
    detail::LightLock lock(server_->mutex_);
    if (auto error = server_->admit(connection_)) return tl::unexpected(std::move(*error));
    auto table = server_->table(lock_ref.table);
    if (!table) return tl::unexpected(table.error());
    const auto found = (*table)->rows.find(lock_ref.lock_name);
    if (found == (*table)->rows.end() || !found->second.present) return std::optional<LockRow>{};
    auto before = server_->to_row(found->first, found->second);
    change(found->second, **table);
    return std::optional<LockRow>{std::move(before)};
  }

  template <class Change>
  PGMUTEX_ALWAYS_INLINE Result<void> on_holder_row(const HolderKey& key, Change change) noexcept {
    server_->delay();
    if (auto hung = server_->any_hung() ? server_->wait_if_hung(connection_, key.timeout) : std::nullopt) [[unlikely]]
      return tl::unexpected(std::move(*hung));
    detail::LightLock lock(server_->mutex_);
    if (auto error = server_->admit(connection_)) return tl::unexpected(std::move(*error));
    const Place found = place_for(key.lock);
    if (found.row == nullptr) [[unlikely]]
      return tl::unexpected(table_error(key.lock));
    MemoryServer::Row* row = holder_row(*found.row, key);
    if (row == nullptr)
      return fail(Errc::lock_not_held, "lock '" + std::string(key.lock.lock_name) + "' has no row for instance '" +
                                           std::string(key.instance_id) + "' with fence " + std::to_string(key.fence));
    change(*row, *found.table);
    if (server_->reply_lost()) return fail(Errc::outcome_unknown, "reply lost after commit");
    return {};
  }

  // ---- elections' records ----------------------------------------------------

  LeaderRecord record_of(const detail::ElectionEntry& e) const {
    LeaderRecord out;
    out.term = e.term;
    out.change = e.change;
    out.announced = e.announced;
    out.value = e.value;
    out.instance_id = e.instance_id;
    out.host = e.host;
    out.since_us = std::chrono::duration_cast<std::chrono::microseconds>(server_->wall(e.since).time_since_epoch()).count();
    return out;
  }

  // An announce's or vacate's failure: on_holder_row's "no row" said in
  // term_refused's words, as the Postgres backend says it; any other error as it is.
  static std::optional<tl::unexpected<Error>> not_holding(Result<void>& done, const HolderKey& key,
                                                          std::string_view what) {
    if (done) return std::nullopt;
    if (done.error() == Errc::lock_not_held) return term_refused(key, what, false, {});
    return tl::unexpected(std::move(done.error()));
  }

  // ---- the queue's rules, called with the server's mutex held -------------

  // The row written for a grant: to a plain try, to a waiter directly, or
  // offered to one.
  // `identity`: the granted mutex's LockRef::identity, 0 if unknown.
  PGMUTEX_ALWAYS_INLINE void grant(MemoryServer::Row& row, MemoryServer::Table& table, std::uint64_t history,
                                   std::uint64_t identity, std::string_view instance_id, GrantToken token,
                                   std::chrono::nanoseconds stale, std::string_view host, std::int64_t pid,
                                   std::string_view command, std::chrono::nanoseconds now) {
    // Assigned only when they differ: the same holder acquiring again copies
    // nothing, and the same mutex (identity) compares nothing either. Before
    // the row's first store: with that store first, GCC 12 loaded every
    // argument (these strings included) ahead of it and spilled half of them
    // to the stack, on every grant.
    if (identity == 0 || row.holder_identity != identity) [[unlikely]] {
      if (!detail::same_text(row.instance_id, instance_id)) row.instance_id.assign(instance_id);
      if (!detail::same_text(row.holder_host, host)) row.holder_host.assign(host);
      if (!detail::same_text(row.holder_command, command)) row.holder_command.assign(command);
      row.holder_identity = identity;
    }
    row.present = true;
    row.fence = ++table.sequence + static_cast<Fence>(history << 40);
    row.token = token;
    row.stale_threshold = stale;
    row.holder_pid = pid;
    row.last_heartbeat = row.acquired_at = now;
    MemoryServer::made_durable(row);
    server_->flush();
  }

  detail::WaiterQueue& queue_of(MemoryServer::Table& table, std::string_view lock_name) {
    auto it = table.queues.find(lock_name);
    if (it == table.queues.end()) it = table.queues.emplace(std::string(lock_name), detail::WaiterQueue{}).first;
    return it->second;
  }

  // The pending offer the row carries, if any.
  static detail::Waiter* offer_on(const MemoryServer::Row& row, detail::WaiterQueue& line) {
    if (!row.present) return nullptr;
    detail::Waiter* w = line.offered(row.fence, row.token);
    return w != nullptr && w->instance_id == row.instance_id ? w : nullptr;
  }

  // Free, stale for `stale` (and the holder's threshold), or an offer that
  // lapsed: at its deadline only, as on Postgres (queue_sql.cpp, offer_cte),
  // even if its waiter died.
  bool available(const MemoryServer::Row& row, detail::WaiterQueue& line, std::chrono::nanoseconds stale,
                 std::chrono::nanoseconds now) const {
    if (!row.present || row.last_heartbeat < now - std::max(stale, row.stale_threshold)) return true;
    const detail::Waiter* offer = offer_on(row, line);
    return offer != nullptr && offer->offered_until < now;
  }

  // Removes the dead waiters not offered the lock, and those whose offer is
  // not the row's any more (the row's own offer stands until it lapses).
  void sweep(const MemoryServer::Row& row, MemoryServer::Table& table, detail::WaiterQueue& line) {
    table.waiting -= line.remove_if([&](const detail::Waiter& w) {
      if (w.offered_fence != 0) return !(row.present && row.fence == w.offered_fence && row.token == w.token);
      return !server_->alive(w);
    });
  }

  void record(std::string_view table_name, std::string_view lock_name, const MemoryServer::Row& row,
              std::int64_t ticket, bool offered, detail::WaiterQueue* line) {
    if (!server_->record_grants_) return;
    MemoryServer::QueueGrant g{MemoryServer::table_key(table_name), std::string(lock_name), row.fence, ticket, offered,
                               {}, server_->now()};
    if (line != nullptr)
      for (const detail::Waiter& w : line->waiters)
        if (w.offered_fence == 0 && server_->alive(w)) g.live_before.push_back(w.ticket);
    server_->grants_.push_back(std::move(g));
  }

  // Gives the row to `head` as an offer: a fresh fence, the head's token; its
  // place marked offered until its handoff deadline.
  void offer_to(MemoryServer::Row& row, MemoryServer::Table& table, std::string_view table_name, std::string_view lock_name,
                detail::WaiterQueue& line, detail::Waiter& head, std::chrono::nanoseconds now) {
    grant(row, table, server_->history_.load(std::memory_order_relaxed), /*identity=*/0, head.instance_id, head.token,
          head.stale_threshold, head.holder_host, head.holder_pid, head.holder_command, now);
    record(table_name, lock_name, row, head.ticket, true, &line);
    head.offered_fence = row.fence;
    head.offered_until = now + head.handoff_deadline;
  }

  // A release in place: the row goes to the first live waiter not offered
  // anything, as an offer; with nobody live it is deleted ('' for the line).
  PGMUTEX_NOINLINE void hand_off(MemoryServer::Row& row, MemoryServer::Table& table, const LockRef& lock_ref) {
    const std::string_view lock_name = lock_ref.lock_name;
    detail::WaiterQueue& line = queue_of(table, lock_name);
    const auto alive = [&](const detail::Waiter& w) { return server_->alive(w); };
    if (detail::Waiter* head = line.live(alive)) {
      offer_to(row, table, lock_ref.table, lock_name, line, *head, server_->now());
    } else {
      row.present = false;
      ++line.freed;
      server_->flush();
    }
    sweep(row, table, line);
  }

  // A try on a table where someone waits, or a queued try (see AcquireRequest::queue_ticket).
  PGMUTEX_NOINLINE void try_in_line(const AcquireRequest& request, Place& place, std::uint64_t history, double grace_left,
                   std::chrono::nanoseconds now, AcquireResult& result) {
    MemoryServer::Table& table = *place.table;
    MemoryServer::Row& row = *place.row;
    detail::WaiterQueue& line = queue_of(table, request.lock.lock_name);
    const auto alive = [&](const detail::Waiter& w) { return server_->alive(w); };
    const detail::Waiter* offer = offer_on(row, line);
    const auto name_holder = [&] {
      result.fence = row.fence;
      result.holder = row.instance_id;
      result.holder_age_s = server_->age_seconds(row);
      result.holder_token = offer != nullptr ? 0 : row.token;  // an offer is its waiter's to confirm
    };
    detail::Waiter* me = nullptr;
    if (request.queue_ticket != 0) {
      // Our grant (offered, or confirmed before a lost reply): confirm it.
      if (row.present && row.token == request.token && detail::same_text(row.instance_id, request.instance_id)) {
        // Committed asynchronously if the server says so (set_unflushed_confirms): a provisional grant.
        const detail::Waiter* mine = line.find(request.queue_ticket);
        if (mine != nullptr && mine->offered_fence == row.fence && mine->token == row.token) [[likely]]
          result.provisional_for = server_->unflushed_confirm(request.lock.table, request.lock.lock_name, *mine, row, now);
        server_->beat(row);
        if (result.provisional_for == std::chrono::nanoseconds::zero()) {
          MemoryServer::made_durable(row);
          server_->flush();
        }
        table.waiting -= line.remove_if([&](const detail::Waiter& w) { return w.ticket == request.queue_ticket; });
        result.acquired = true;
        result.fence = row.fence;
        return;
      }
      me = line.find(request.queue_ticket);
      if (me == nullptr || me->token != request.token || me->offered_fence != 0) {
        if (me != nullptr && me->token == request.token)  // an offer passed on: the place went with it
          table.waiting -= line.remove_if([&](const detail::Waiter& w) { return w.ticket == request.queue_ticket; });
        result.queue_place_lost = true;
        if (row.present) name_holder();
        return;
      }
    }
    if (!available(row, line, request.stale_threshold, now)) return name_holder();
    if (grace_left > 0) {
      result.holder.assign(failover_grace_holder);
      result.failover_grace_left_s = grace_left;
      return;
    }
    detail::Waiter* head = line.live(alive);
    if (head != nullptr && head != me) {
      if (me == nullptr) {  // a plain try loses to a live waiter, and writes nothing
        result.holder = head->instance_id;
        return;
      }
      offer_to(row, table, request.lock.table, request.lock.lock_name, line, *head, now);
      sweep(row, table, line);
      result.fence = row.fence;
      result.holder = row.instance_id;
      return;
    }
    // Ours: nobody live is ahead (or nobody waits, for a plain try).
    if (row.present) {
      result.reclaimed = true;
      result.holder = row.instance_id;
      result.holder_age_s = server_->age_seconds(row);
    }
    grant(row, table, history, request.lock.identity, request.instance_id, request.token, request.stale_threshold,
          request.holder_details.host, request.holder_details.pid, request.holder_details.command, now);
    record(request.lock.table, request.lock.lock_name, row, request.queue_ticket, false, &line);
    if (me != nullptr)
      table.waiting -= line.remove_if([&](const detail::Waiter& w) { return w.ticket == request.queue_ticket; });
    sweep(row, table, line);
    result.acquired = true;
    result.fence = row.fence;
  }

  std::shared_ptr<MemoryServer> server_;
  std::string connection_;
  HeartbeatDurability last_durability_{};
  std::chrono::nanoseconds statement_timeout_{std::chrono::seconds(30)};
  // Touched only with the server's mutex held.
  std::string cached_table_;
  std::string cached_lock_;
  std::uint64_t cached_identity_ = 0;  // the LockRef::identity known to name cached_lock_ in cached_table_, or 0
  Place cached_;
  std::uint64_t beat_history_ = 0;  // the server history of this connection's last heartbeat
};

static_assert(Backend<MemoryBackend>);
static_assert(BackendBatchesHeartbeats<MemoryBackend>);
static_assert(BackendReportsCommitMode<MemoryBackend>);
static_assert(BackendReportsSession<MemoryBackend>);
static_assert(BackendReportsHistory<MemoryBackend>);
static_assert(BackendPollsQueue<MemoryBackend>);
static_assert(BackendShares<MemoryBackend>);
static_assert(BackendKeepsElections<MemoryBackend>);
static_assert(BackendElectsInOneStatement<MemoryBackend>);

}  // namespace pgmutex
