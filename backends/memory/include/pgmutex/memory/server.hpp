// MemoryServer: the database that in-memory backends connect to. It keeps the
// lock rows and fence sequences, the server clock (real or virtual, with
// skew), the durability model of asynchronous heartbeats (what a restart
// forgets), a standby for failover, and the faults a test injects.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

#include "pgmutex/backend.hpp"
#include "pgmutex/detail/light_mutex.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/table_name.hpp"
#include "pgmutex/testing/manual_clock.hpp"
#include "pgmutex/testing/manual_executor.hpp"

namespace pgmutex {

class MemoryServer : public std::enable_shared_from_this<MemoryServer> {
 public:
  using TimeSource = std::function<std::chrono::nanoseconds()>;
  using Sleeper = std::function<void(std::chrono::nanoseconds)>;
  // How a hung statement waits: until `ready()` or its timeout (none: no
  // limit); returns ready(). Real time blocks the thread; virtual time lets
  // the simulation run meanwhile.
  using HangWaiter =
      std::function<bool(std::optional<std::chrono::nanoseconds> timeout, const std::function<bool()>& ready)>;

  // Real time: the server clock is the steady clock; latency really sleeps,
  // and a hung statement blocks its thread until unhang() or its timeout.
  static std::shared_ptr<MemoryServer> create() {
    const auto start = std::chrono::steady_clock::now();
    auto server = std::make_shared<MemoryServer>(
        [start] { return std::chrono::steady_clock::now() - start; },
        [](std::chrono::nanoseconds d) { std::this_thread::sleep_for(d); });
    server->waiter_ = [raw = server.get()](std::optional<std::chrono::nanoseconds> timeout,
                                            const std::function<bool()>& ready) {
      std::unique_lock lock(raw->hang_mutex_);
      if (!timeout) {
        raw->unhung_.wait(lock, ready);
        return true;
      }
      return raw->unhung_.wait_for(lock, *timeout, ready);
    };
    return server;
  }

  // Virtual time: the server clock follows `clock` (plus any skew set later);
  // injected latency advances it. Nothing runs while a statement hangs: it
  // waits out its timeout at once.
  static std::shared_ptr<MemoryServer> create(testing::ManualClock clock) {
    auto server = std::make_shared<MemoryServer>([clock] { return clock.now().time_since_epoch(); },
                                                 [clock](std::chrono::nanoseconds d) mutable { clock.advance(d); });
    server->waiter_ = [raw = server.get(), clock](std::optional<std::chrono::nanoseconds> timeout,
                                                  const std::function<bool()>& ready) mutable {
      if (!raw->locked(ready) && timeout) clock.advance(*timeout);
      return raw->locked(ready);
    };
    return server;
  }

  // Virtual time run by `executor`: latency and hung statements let time pass
  // through the executor, so the tasks that fall due meanwhile run (a lease
  // deadline fires while a heartbeat hangs, as it does for real).
  static std::shared_ptr<MemoryServer> create(testing::ManualExecutor executor) {
    const testing::ManualClock clock = executor.clock();
    auto server = std::make_shared<MemoryServer>(
        [clock] { return clock.now().time_since_epoch(); },
        [executor](std::chrono::nanoseconds d) mutable { executor.advance(d); });
    server->waiter_ = [raw = server.get(), executor](std::optional<std::chrono::nanoseconds> timeout,
                                                     const std::function<bool()>& ready) mutable {
      std::optional<testing::ManualClock::time_point> deadline;
      if (timeout) deadline = executor.clock().now() + *timeout;
      return executor.wait_until(deadline, [&] { return raw->locked(ready); });
    };
    return server;
  }

  MemoryServer(TimeSource time, Sleeper sleeper) : time_(std::move(time)), sleeper_(std::move(sleeper)) {}

  // ---- fault injection -------------------------------------------------

  // A fault plan: the next operations meet these faults in order, one each
  // (any connection), before the standing faults below apply.
  enum class Fault {
    none,        // the operation runs normally
    fail,        // it fails with backend_unavailable and changes nothing
    lose_reply,  // it is applied, but the reply is lost (outcome_unknown)
  };
  void plan(std::initializer_list<Fault> faults) {
    detail::LightLock lock(mutex_);
    plan_.insert(plan_.end(), faults);
    rearm();
  }

  // The next n operations (of any connection) fail with `error` and change nothing.
  void fail_next(int n, Errc error = Errc::backend_unavailable) {
    detail::LightLock lock(mutex_);
    fail_next_ = n;
    fail_with_ = error;
    rearm();
  }
  // Every operation takes this long (client time). The wait happens before the
  // operation takes the server's lock, so operations of several connections
  // wait at once (as they would on a real server) and the sleeper may be
  // called from several threads at once.
  void set_latency(std::chrono::nanoseconds latency) { latency_.store(latency.count(), std::memory_order_relaxed); }
  // The connection's next operation fails as a dropped connection; the one after reconnects.
  void drop_connection(std::string_view connection) {
    detail::LightLock lock(mutex_);
    dropped_.emplace(connection);
    rearm();
  }
  // Every operation of the connection fails until heal().
  void partition(std::string_view connection) {
    detail::LightLock lock(mutex_);
    partitioned_.emplace(connection);
    rearm();
  }
  void heal(std::string_view connection) {
    detail::LightLock lock(mutex_);
    if (const auto it = partitioned_.find(connection); it != partitioned_.end()) partitioned_.erase(it);
    rearm();
  }
  // The next n operations are applied, but their replies are lost.
  void lose_replies(int n) {
    detail::LightLock lock(mutex_);
    lose_replies_ = n;
    rearm();
  }
  // Every statement of the connection hangs, before it is applied, until
  // unhang(): a statement waiting on a row lock (it then runs) or a frozen
  // peer. One whose timeout (HolderKey / AcquireRequest) passes first fails
  // with backend_unavailable and changes nothing.
  void hang(std::string_view connection) {
    {
      std::lock_guard lock(hang_mutex_);
      hung_.emplace(connection);
    }
    any_hung_.store(true, std::memory_order_release);
  }
  void unhang(std::string_view connection) {
    {
      std::lock_guard lock(hang_mutex_);
      if (const auto it = hung_.find(connection); it != hung_.end()) hung_.erase(it);
      any_hung_.store(!hung_.empty(), std::memory_order_release);
    }
    unhung_.notify_all();
  }
  // How many statements are hanging now.
  [[nodiscard]] int hanging() const {
    std::lock_guard lock(hang_mutex_);
    return hanging_;
  }

  // Heartbeats commit asynchronously, as PostgresBackend's do by default: one
  // becomes durable `flush_delay` after it (the WAL writer's round), or at the
  // next synchronous commit (an acquire or a release, of any row). restart()
  // forgets the ones that are not durable yet. Set before making mutexes:
  // they read it (heartbeat_commits_asynchronously) to size their margin.
  void set_asynchronous_heartbeats(std::chrono::nanoseconds flush_delay) {
    detail::LightLock lock(mutex_);
    flush_delay_ = flush_delay;
  }
  [[nodiscard]] bool asynchronous_heartbeats() const noexcept {
    detail::LightLock lock(mutex_);
    return flush_delay_ > std::chrono::nanoseconds::zero();
  }

  // A crash and restart: heartbeats that were not durable yet are forgotten
  // (each such row goes back to its last durable heartbeat), and the next
  // operation fails as its connection did.
  void restart() {
    detail::LightLock lock(mutex_);
    for (auto& [name, table] : tables_)
      for (auto& [lock_name, row] : table.rows)
        if (row.present) {
          settle(row);
          if (!durable(row.last_heartbeat)) row.last_heartbeat = row.durable_heartbeat;
          row.unflushed.clear();
        }
    last_flush_ = now();  // what survived is on disk
    restarts_.fetch_add(1, std::memory_order_relaxed);
    fail_next_ = std::max(fail_next_, 1);
    fail_with_ = Errc::backend_unavailable;
    rearm();
  }

  // A standby, for failover tests: replicate() copies every table as it is
  // now (grants, heartbeats, the fence sequence); fail_over() promotes that
  // copy. Everything since the last replicate() is lost, as with
  // asynchronous replication; the server history changes (see
  // BackendReportsHistory), fences from then on exceed every earlier one
  // (the sequence plus history << 40, as PostgresBackend's timeline term),
  // the failover grace applies (set_failover_grace), and the next operation
  // fails as its connection did.
  void replicate() {
    detail::LightLock lock(mutex_);
    standby_.clear();
    for (const auto& [name, table] : tables_) standby_.emplace(name, table);
  }
  void fail_over() {
    detail::LightLock lock(mutex_);
    // Rows are restored in place: backends keep pointers to them.
    for (auto& [name, table] : tables_) {
      const auto copy = standby_.find(name);
      table.sequence = copy == standby_.end() ? 0 : copy->second.sequence;
      table.grace_history = copy == standby_.end() ? 0 : copy->second.grace_history;
      table.grace_since = copy == standby_.end() ? std::chrono::nanoseconds{} : copy->second.grace_since;
      table.grace_longest = copy == standby_.end() ? std::chrono::nanoseconds{} : copy->second.grace_longest;
      for (auto& [lock_name, row] : table.rows) {
        const Row* copied = nullptr;
        if (copy != standby_.end())
          if (const auto r = copy->second.rows.find(lock_name); r != copy->second.rows.end()) copied = &r->second;
        if (copied != nullptr) row = *copied;
        else row.present = false;
      }
    }
    history_.fetch_add(1, std::memory_order_relaxed);
    restarts_.fetch_add(1, std::memory_order_relaxed);
    last_flush_ = now();
    fail_next_ = std::max(fail_next_, 1);
    fail_with_ = Errc::backend_unavailable;
    rearm();
  }

  // The failover grace, as PostgresOptions::failover_grace: after a
  // fail_over(), nothing that looks free or stale is granted until the new
  // history has been known (first seen by an acquire) this long. Default
  // (nullopt): the larger of the requester's stale threshold and the longest
  // stored with a row when the history was first seen; 0: off.
  void set_failover_grace(std::optional<std::chrono::nanoseconds> grace) {
    detail::LightLock lock(mutex_);
    failover_grace_ = grace;
  }

  // Moves the server clock relative to the clients' clocks (clock skew).
  void set_server_offset(std::chrono::nanoseconds offset) {
    detail::LightLock lock(mutex_);
    offset_ = offset;
  }

  // The row as it is, bypassing faults and counters: for a test's invariants.
  [[nodiscard]] std::optional<LockRow> peek(LockRef lock_ref) const {
    detail::LightLock lock(mutex_);
    const auto table = tables_.find(table_key(lock_ref.table));
    if (table == tables_.end()) return std::nullopt;
    const auto row = table->second.rows.find(lock_ref.lock_name);
    if (row == table->second.rows.end() || !row->second.present) return std::nullopt;
    return to_row(row->first, row->second);
  }

  [[nodiscard]] std::uint64_t operations() const {
    detail::LightLock lock(mutex_);
    return operations_;
  }
  [[nodiscard]] std::chrono::nanoseconds server_now() const {
    detail::LightLock lock(mutex_);
    return now();
  }

 private:
  friend class MemoryBackend;

  struct Row {
    bool present = false;  // released rows stay allocated, so a cycle does not allocate
    std::string instance_id;
    Fence fence = 0;
    GrantToken token = 0;
    std::chrono::nanoseconds stale_threshold{};  // the holder's
    std::chrono::nanoseconds durable_heartbeat{};  // what a restart keeps of last_heartbeat (see settle)
    std::deque<std::chrono::nanoseconds> unflushed;  // asynchronous heartbeats since, not yet known durable
    std::chrono::nanoseconds last_heartbeat{};
    std::chrono::nanoseconds acquired_at{};
    std::string holder_host;  // as the request gave them: the memory backend has no defaults
    std::int64_t holder_pid = 0;
    std::string holder_command;
  };
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  using Rows = std::unordered_map<std::string, Row, StringHash, std::equal_to<>>;
  struct Table {
    Rows rows;
    Fence sequence = 0;  // like mutex_lock_fence_seq: one counter per table
    // The failover grace's marker (PostgresBackend keeps it in a row): the
    // history it was written in, when that history was first seen, and the
    // longest stale threshold among the rows then.
    std::uint64_t grace_history = 0;
    std::chrono::nanoseconds grace_since{};
    std::chrono::nanoseconds grace_longest{};
  };

  // Called with mutex_ held, in a history after a fail_over(): how long the
  // failover grace still runs, in seconds (0 or less: over or off). The
  // first call in a history writes the marker.
  double failover_grace_left(Table& table, std::uint64_t history, std::chrono::nanoseconds stale_threshold,
                             std::chrono::nanoseconds now) {
    if (failover_grace_ && *failover_grace_ <= std::chrono::nanoseconds::zero()) return 0;
    if (table.grace_history != history) {
      table.grace_history = history;
      table.grace_since = now;
      table.grace_longest = {};
      for (const auto& [name, row] : table.rows)
        if (row.present) table.grace_longest = std::max(table.grace_longest, row.stale_threshold);
    }
    const std::chrono::nanoseconds grace =
        failover_grace_ ? *failover_grace_ : std::max(stale_threshold, table.grace_longest);
    return std::chrono::duration<double>(table.grace_since + grace - now).count();
  }

  // Called before an operation takes mutex_: the injected latency, if any.
  void delay() {
    const std::chrono::nanoseconds latency(latency_.load(std::memory_order_relaxed));
    if (latency > std::chrono::nanoseconds::zero()) [[unlikely]]
      sleeper_(latency);
  }

  // `ready` (which reads the hung connections) with hang_mutex_ held.
  bool locked(const std::function<bool()>& ready) {
    std::lock_guard lock(hang_mutex_);
    return ready();
  }

  // Called before an operation takes mutex_: waits while its connection
  // hangs. An error if its timeout passed first.
  PGMUTEX_ALWAYS_INLINE bool any_hung() const noexcept { return any_hung_.load(std::memory_order_acquire); }
  PGMUTEX_NOINLINE std::optional<Error> wait_if_hung(std::string_view connection, std::chrono::nanoseconds timeout) {
    const auto is_hung = [&] {
      std::lock_guard lock(hang_mutex_);
      return hung_.find(connection) != hung_.end();
    };
    if (!is_hung()) return std::nullopt;
    {
      std::lock_guard lock(hang_mutex_);
      ++hanging_;
    }
    std::optional<std::chrono::nanoseconds> limit;
    if (timeout > std::chrono::nanoseconds::zero()) limit = timeout;
    const bool released = waiter_(limit, [&] { return hung_.find(connection) == hung_.end(); });
    {
      std::lock_guard lock(hang_mutex_);
      --hanging_;
    }
    if (released) return std::nullopt;
    return Error(Errc::backend_unavailable,
                 "connection '" + std::string(connection) + "' hung: " +
                     (limit ? "statement timed out after " + std::to_string(std::chrono::duration<double>(*limit).count()) + "s"
                            : std::string("nothing left that could release it")));
  }

  // Called with mutex_ held after every change to the faults below: whether
  // any of them is armed, so that an operation without faults checks one flag.
  void rearm() noexcept {
    armed_ = !plan_.empty() || !partitioned_.empty() || !dropped_.empty() || fail_next_ > 0 || lose_replies_ > 0;
  }

  // Called with mutex_ held: decides the fate of one operation before it runs.
  // Returns an error to report instead of running it, or nothing.
  std::optional<Error> admit(std::string_view connection) {
    ++operations_;
    if (!armed_) [[likely]]
      return std::nullopt;
    auto error = admit_armed(connection);
    rearm();
    return error;
  }
  std::optional<Error> admit_armed(std::string_view connection) {
    if (!plan_.empty()) {
      const Fault fault = plan_.front();
      plan_.pop_front();
      if (fault == Fault::fail) return Error(Errc::backend_unavailable, "planned failure");
      if (fault == Fault::lose_reply) ++lose_replies_;
    }
    if (!partitioned_.empty() && partitioned_.contains(connection))
      return Error(Errc::backend_unavailable, "connection '" + std::string(connection) + "' is partitioned");
    if (!dropped_.empty()) {
      if (const auto it = dropped_.find(connection); it != dropped_.end()) {
        dropped_.erase(it);
        return Error(Errc::backend_unavailable, "connection dropped");
      }
    }
    if (fail_next_ > 0) {
      --fail_next_;
      return Error(fail_with_, "injected failure");
    }
    return std::nullopt;
  }
  // Called with mutex_ held after an operation was applied.
  bool reply_lost() {
    if (!armed_ || lose_replies_ <= 0) [[likely]]
      return false;
    --lose_replies_;
    rearm();
    return true;
  }

  // A table's key, as Postgres names it: Locks.Jobs and locks.jobs are one
  // table (psql's rules, pgmutex/table_name.hpp). A name that breaks them is
  // refused before it gets here.
  static std::string table_key(std::string_view name) {
    auto parsed = parse_table_name(name);
    return parsed ? sql_name(*parsed) : std::string(name);
  }

  Result<Table*> table(std::string_view name) {
    if (last_table_ != nullptr && last_table_name_ == name) return last_table_;
    const auto it = tables_.find(table_key(name));
    if (it == tables_.end())
      return fail(Errc::schema_missing, "table '" + std::string(name) + "' does not exist (call create_schema)");
    last_table_name_ = name;
    last_table_ = &it->second;
    return &it->second;
  }

  std::chrono::nanoseconds now() const { return time_() + offset_; }

  // Called with mutex_ held. Whether a heartbeat stamped at `t` would survive a crash now.
  bool durable(std::chrono::nanoseconds t) const {
    return flush_delay_ <= std::chrono::nanoseconds::zero() || t <= last_flush_ || t <= now() - flush_delay_;
  }
  // Called with mutex_ held: a heartbeat of `row`, committed asynchronously if so set.
  void beat(Row& row) {
    settle(row);
    row.last_heartbeat = now();
    if (flush_delay_ > std::chrono::nanoseconds::zero()) [[unlikely]]
      row.unflushed.push_back(row.last_heartbeat);
    else
      row.durable_heartbeat = row.last_heartbeat;
  }
  // Called with mutex_ held: every heartbeat of `row` that is durable by now
  // is what a restart keeps, the newest of them (not just the one before the
  // last: a WAL writer slower than the beats flushes several at once).
  void settle(Row& row) const {
    while (!row.unflushed.empty() && durable(row.unflushed.front())) {
      row.durable_heartbeat = std::max(row.durable_heartbeat, row.unflushed.front());
      row.unflushed.pop_front();
    }
  }
  // Called with mutex_ held: `row` was just committed synchronously.
  static void made_durable(Row& row) {
    row.durable_heartbeat = row.last_heartbeat;
    if (!row.unflushed.empty()) row.unflushed.clear();  // a deque's clear() is a call even when empty
  }
  // Called with mutex_ held: the write-ahead log as a heartbeat starting now
  // sees it, for BackendReportsDurability. A position is a server time (+1,
  // so that 0 stays "not told"): a commit at t is on disk once the flushed
  // position reaches t, as durable() says.
  HeartbeatDurability wal_now(bool durable_commit) const {
    const auto position = [](std::chrono::nanoseconds t) { return static_cast<std::uint64_t>(t.count()) + 1; };
    const std::chrono::nanoseconds flushed =
        flush_delay_ <= std::chrono::nanoseconds::zero() ? now() : std::max(last_flush_, now() - flush_delay_);
    return HeartbeatDurability{durable_commit, position(now()), position(flushed)};
  }
  // Called with mutex_ held: a synchronous commit flushes every earlier one.
  // Only asynchronous heartbeats need the time of it: no clock read otherwise.
  void flush() {
    if (flush_delay_ > std::chrono::nanoseconds::zero()) [[unlikely]]
      last_flush_ = now();
  }

  std::chrono::system_clock::time_point wall(std::chrono::nanoseconds server_time) const {
    return epoch_ + std::chrono::duration_cast<std::chrono::system_clock::duration>(server_time);
  }

  double age_seconds(const Row& row) const {
    return std::chrono::duration<double>(now() - row.last_heartbeat).count();
  }

  LockRow to_row(std::string_view name, const Row& row) const {
    return LockRow{std::string(name), row.instance_id, row.fence, wall(row.acquired_at), age_seconds(row),
                   row.token, row.stale_threshold, row.holder_host, row.holder_pid, row.holder_command};
  }

  mutable detail::LightMutex mutex_;  // held briefly: injected latency is waited before taking it
  TimeSource time_;
  Sleeper sleeper_;
  std::chrono::system_clock::time_point epoch_ = std::chrono::sys_days{std::chrono::year{2026} / 1 / 1};
  std::unordered_map<std::string, Table, StringHash, std::equal_to<>> tables_;
  std::uint64_t operations_ = 0;
  int fail_next_ = 0;
  Errc fail_with_ = Errc::backend_unavailable;
  int lose_replies_ = 0;
  std::deque<Fault> plan_;
  std::string last_table_name_;  // the name last looked up, as the caller spelled it (its table's address: last_table_)
  Table* last_table_ = nullptr;
  std::atomic<std::chrono::nanoseconds::rep> latency_{0};  // read without mutex_, by delay()
  bool armed_ = false;  // any fault above (not latency) is armed: see rearm()
  std::chrono::nanoseconds offset_{};
  std::optional<std::chrono::nanoseconds> failover_grace_;  // see set_failover_grace
  std::chrono::nanoseconds flush_delay_{};  // zero: heartbeats commit synchronously
  std::chrono::nanoseconds last_flush_{};
  // restart()s and fail_over()s so far: the server session. Changed with
  // mutex_ held; read without it, like history_ (a session read per acquire).
  std::atomic<std::uint64_t> restarts_{0};
  // fail_over()s so far. Changed with mutex_ held; read without it too, so
  // that asking for it costs an acquire/release cycle no lock.
  std::atomic<std::uint64_t> history_{0};
  std::unordered_map<std::string, Table, StringHash, std::equal_to<>> standby_;  // replicate()'s copy
  std::set<std::string, std::less<>> dropped_;
  std::set<std::string, std::less<>> partitioned_;
  // Hung connections: their own std::mutex, since a real-time hang waits on a condition variable.
  HangWaiter waiter_;
  mutable std::mutex hang_mutex_;
  std::condition_variable unhung_;
  std::set<std::string, std::less<>> hung_;
  int hanging_ = 0;
  std::atomic<bool> any_hung_{false};
};

}  // namespace pgmutex
