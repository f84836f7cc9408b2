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
#include "pgmutex/options.hpp"

namespace pgmutex {

class MemoryBackend {
 public:
  // `connection` names this connection for partition() and drop_connection().
  explicit MemoryBackend(std::shared_ptr<MemoryServer> server, std::string connection = "default")
      : server_(std::move(server)), connection_(std::move(connection)) {}

  [[nodiscard]] const std::shared_ptr<MemoryServer>& server() const noexcept { return server_; }

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
    auto found = row_for(request.lock);
    if (!found) {
      out = tl::unexpected(std::move(found.error()));
      return out;
    }
    MemoryServer::Row& row = *found->row;
    const auto now = server_->now();

    AcquireResult& result = *out;
    // After a failover, the grace (see MemoryServer::set_failover_grace).
    const std::uint64_t history = server_->history_.load(std::memory_order_relaxed);
    double grace_left = 0;
    if (history != 0) [[unlikely]]
      grace_left = server_->failover_grace_left(*found->table, history, request.stale_threshold, now);
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
      row.present = true;
      if (!detail::same_text(row.instance_id, request.instance_id)) row.instance_id.assign(request.instance_id);
      row.fence = ++found->table->sequence + static_cast<Fence>(history << 40);
      row.token = request.token;
      row.stale_threshold = request.stale_threshold;
      // Assigned only when they differ: the same holder acquiring again copies nothing.
      if (!detail::same_text(row.holder_host, request.holder_details.host)) row.holder_host.assign(request.holder_details.host);
      row.holder_pid = request.holder_details.pid;
      if (!detail::same_text(row.holder_command, request.holder_details.command))
        row.holder_command.assign(request.holder_details.command);
      row.last_heartbeat = row.acquired_at = now;
      MemoryServer::made_durable(row);
      server_->flush();
      result.acquired = true;
      result.fence = row.fence;
    }
    if (server_->reply_lost()) out = fail(Errc::outcome_unknown, "reply lost after commit");
    return out;
  }

  Result<void> heartbeat(const HolderKey& key) noexcept {
    last_durability_ = {};
    return on_holder_row(key, [&](MemoryServer::Row& row) {
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

  Result<void> release(const HolderKey& key) noexcept {
    return on_holder_row(key, [&](MemoryServer::Row& row) {
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
    return on_present_row(lock_ref, [](MemoryServer::Row&) {});
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

  Result<std::optional<LockRow>> force_release(LockRef lock_ref) noexcept {
    return on_present_row(lock_ref, [](MemoryServer::Row& row) { row.present = false; });
  }

 private:
  // The row this holder owns, or nullptr if it was released or granted again.
  PGMUTEX_ALWAYS_INLINE static MemoryServer::Row* holder_row(MemoryServer::Row& row, const HolderKey& key) noexcept {
    if (!row.present || row.fence != key.fence || row.token != key.token ||
        !detail::same_text(row.instance_id, key.instance_id))
      return nullptr;
    return &row;
  }

  // The row of a lock, made (absent) if new. Rows and tables are never erased
  // and map nodes never move, so the last one looked up is kept: a mutex asks
  // for one lock, again and again.
  struct Place {
    MemoryServer::Table* table = nullptr;
    MemoryServer::Row* row = nullptr;
  };
  // The cache is kept by contents, never by the address of the caller's
  // strings: those may be temporaries that a later call's strings reuse.
  PGMUTEX_ALWAYS_INLINE Result<Place> row_for(const LockRef& lock) {
    if (cached_.row != nullptr && detail::same_text(cached_lock_, lock.lock_name) &&
        detail::same_text(cached_table_, lock.table)) [[likely]]
      return cached_;
    return find_row(lock);
  }
  PGMUTEX_NOINLINE Result<Place> find_row(const LockRef& lock) {
    auto table = server_->table(lock.table);
    if (!table) return tl::unexpected(table.error());
    auto found = (*table)->rows.find(lock.lock_name);
    if (found == (*table)->rows.end())
      found = (*table)->rows.emplace(std::string(lock.lock_name), MemoryServer::Row{}).first;
    cached_table_.assign(lock.table);
    cached_lock_.assign(lock.lock_name);
    cached_ = Place{*table, &found->second};
    return cached_;
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
    change(found->second);
    return std::optional<LockRow>{std::move(before)};
  }

  template <class Change>
  PGMUTEX_ALWAYS_INLINE Result<void> on_holder_row(const HolderKey& key, Change change) noexcept {
    server_->delay();
    if (auto hung = server_->any_hung() ? server_->wait_if_hung(connection_, key.timeout) : std::nullopt) [[unlikely]]
      return tl::unexpected(std::move(*hung));
    detail::LightLock lock(server_->mutex_);
    if (auto error = server_->admit(connection_)) return tl::unexpected(std::move(*error));
    auto found = row_for(key.lock);
    if (!found) return tl::unexpected(std::move(found.error()));
    MemoryServer::Row* row = holder_row(*found->row, key);
    if (row == nullptr)
      return fail(Errc::lock_not_held, "lock '" + std::string(key.lock.lock_name) + "' has no row for instance '" +
                                           std::string(key.instance_id) + "' with fence " + std::to_string(key.fence));
    change(*row);
    if (server_->reply_lost()) return fail(Errc::outcome_unknown, "reply lost after commit");
    return {};
  }

  std::shared_ptr<MemoryServer> server_;
  std::string connection_;
  HeartbeatDurability last_durability_{};
  std::chrono::nanoseconds statement_timeout_{std::chrono::seconds(30)};
  // Touched only with the server's mutex held.
  std::string cached_table_;
  std::string cached_lock_;
  Place cached_;
  std::uint64_t beat_history_ = 0;  // the server history of this connection's last heartbeat
};

static_assert(Backend<MemoryBackend>);
static_assert(BackendBatchesHeartbeats<MemoryBackend>);
static_assert(BackendReportsCommitMode<MemoryBackend>);
static_assert(BackendReportsSession<MemoryBackend>);
static_assert(BackendReportsHistory<MemoryBackend>);

}  // namespace pgmutex
