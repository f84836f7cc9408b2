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
#include <vector>

#include "pgmutex/backend.hpp"
#include "pgmutex/detail/light_mutex.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/memory/elections.hpp"
#include "pgmutex/memory/fault_plan.hpp"
#include "pgmutex/memory/hung_connections.hpp"
#include "pgmutex/memory/waiter_queue.hpp"
#include "pgmutex/table_name.hpp"
#include "pgmutex/testing/manual_clock.hpp"
#include "pgmutex/testing/manual_executor.hpp"

namespace pgmutex {

class MemoryServer : public std::enable_shared_from_this<MemoryServer> {
 public:
  using TimeSource = std::function<std::chrono::nanoseconds()>;
  using Sleeper = std::function<void(std::chrono::nanoseconds)>;
  // How a hung statement waits (detail/hung_connections.hpp): real time
  // blocks the thread; virtual time lets the simulation run meanwhile.
  using HangWaiter = detail::HungConnections::Waiter;

  // Real time: the server clock is the steady clock; latency really sleeps,
  // and a hung statement blocks its thread until unhang() or its timeout.
  static std::shared_ptr<MemoryServer> create() {
    const auto start = std::chrono::steady_clock::now();
    auto server = std::make_shared<MemoryServer>(
        [start] { return std::chrono::steady_clock::now() - start; },
        [](std::chrono::nanoseconds d) { std::this_thread::sleep_for(d); });
    server->hung_.set_waiter([hung = &server->hung_](std::optional<std::chrono::nanoseconds> timeout,
                                                     const std::function<bool()>& ready) {
      return hung->wait_real_time(timeout, ready);
    });
    return server;
  }

  // Virtual time: the server clock follows `clock` (plus any skew set later);
  // injected latency advances it. Nothing runs while a statement hangs: it
  // waits out its timeout at once.
  static std::shared_ptr<MemoryServer> create(testing::ManualClock clock) {
    auto server = std::make_shared<MemoryServer>([clock] { return clock.now().time_since_epoch(); },
                                                 [clock](std::chrono::nanoseconds d) mutable { clock.advance(d); });
    server->virtual_clock_ = clock;
    server->hung_.set_waiter([hung = &server->hung_, clock](std::optional<std::chrono::nanoseconds> timeout,
                                                            const std::function<bool()>& ready) mutable {
      if (!hung->locked(ready) && timeout) clock.advance(*timeout);
      return hung->locked(ready);
    });
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
    server->virtual_clock_ = clock;
    server->hung_.set_waiter([hung = &server->hung_, executor](std::optional<std::chrono::nanoseconds> timeout,
                                                     const std::function<bool()>& ready) mutable {
      std::optional<testing::ManualClock::time_point> deadline;
      if (timeout) deadline = executor.clock().now() + *timeout;
      return executor.wait_until(deadline, [&] { return hung->locked(ready); });
    });
    return server;
  }

  MemoryServer(TimeSource time, Sleeper sleeper) : time_(std::move(time)), sleeper_(std::move(sleeper)) {}

  // ---- fault injection -------------------------------------------------

  // A fault plan: the next operations meet these faults in order, one each
  // (any connection), before the standing faults below apply.
  using Fault = detail::FaultPlan::Fault;
  void plan(std::initializer_list<Fault> faults) {
    detail::LightLock lock(mutex_);
    faults_.plan(faults);
  }

  // The next n operations (of any connection) fail with `error` and change nothing.
  void fail_next(int n, Errc error = Errc::backend_unavailable) {
    detail::LightLock lock(mutex_);
    faults_.fail_next(n, error);
  }
  // Every operation takes this long (client time). The wait happens before the
  // operation takes the server's lock, so operations of several connections
  // wait at once (as they would on a real server) and the sleeper may be
  // called from several threads at once.
  void set_latency(std::chrono::nanoseconds latency) { latency_.store(latency.count(), std::memory_order_relaxed); }
  // The connection's next operation fails as a dropped connection; the one after reconnects.
  void drop_connection(std::string_view connection) {
    detail::LightLock lock(mutex_);
    faults_.drop_connection(connection);
  }
  // Every operation of the connection fails until heal().
  void partition(std::string_view connection) {
    detail::LightLock lock(mutex_);
    faults_.partition(connection);
  }
  // A process death: the connection closes and its operations fail from
  // then on. A waiter on it is dead: the next release or look skips it. (A
  // hung or partitioned connection stays alive, like a frozen client.)
  void kill_connection(std::string_view connection) {
    detail::LightLock lock(mutex_);
    faults_.kill(connection);
  }
  void heal(std::string_view connection) {
    detail::LightLock lock(mutex_);
    faults_.heal(connection);
  }
  // The next n operations are applied, but their replies are lost.
  void lose_replies(int n) {
    detail::LightLock lock(mutex_);
    faults_.lose_replies(n);
  }
  // Whether planned failures, injected failures or lost replies still wait
  // for the next operations (a simulation's bookkeeping).
  [[nodiscard]] bool faults_pending() const {
    detail::LightLock lock(mutex_);
    return faults_.pending();
  }
  // Every statement of the connection hangs, before it is applied, until
  // unhang(): a statement waiting on a row lock (it then runs) or a frozen
  // peer. One whose timeout (HolderKey / AcquireRequest) passes first fails
  // with backend_unavailable and changes nothing.
  void hang(std::string_view connection) { hung_.hang(connection); }
  void unhang(std::string_view connection) { hung_.unhang(connection); }
  // How many statements are hanging now.
  [[nodiscard]] int hanging() const { return hung_.hanging(); }

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

  // A queued waiter's confirm of its offer commits asynchronously too, as
  // PostgresBackend's does (PostgresOptions::unflushed_confirm_window), when
  // heartbeats do (set_asynchronous_heartbeats) and the offer has at least
  // `window` left: the grant is provisional (AcquireResult::provisional_for),
  // and restart() before it is durable (flush_delay, or the next synchronous
  // commit) brings the waiter's place back, offered, with the row as the
  // offer left it. nullopt (the default): every confirm is durable.
  void set_unflushed_confirms(std::optional<std::chrono::nanoseconds> window) {
    detail::LightLock lock(mutex_);
    unflushed_window_ = window;
  }
  // How many confirms committed asynchronously, and how many places a
  // restart brought back (their confirms were not durable yet).
  struct UnflushedConfirmCounts {
    std::uint64_t made = 0;
    std::uint64_t taken_back = 0;
  };
  [[nodiscard]] UnflushedConfirmCounts unflushed_confirm_counts() const {
    detail::LightLock lock(mutex_);
    return unflushed_counts_;
  }

  // A crash and restart: heartbeats that were not durable yet are forgotten
  // (each such row goes back to its last durable heartbeat), and the next
  // operation fails as its connection did.
  void restart() {
    detail::LightLock lock(mutex_);
    bring_back_unflushed_confirms();
    for (auto& [name, table] : tables_)
      for (auto& [lock_name, row] : table.rows)
        if (row.present) {
          settle(row);
          if (!durable(row.last_heartbeat)) row.last_heartbeat = row.durable_heartbeat;
          row.unflushed.clear();
        }
    last_flush_ = now();  // what survived is on disk
    restarts_.fetch_add(1, std::memory_order_relaxed);
    faults_.connections_broken();
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
      if (copy == standby_.end()) table.elections.clear();
      else table.elections = copy->second.elections;
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
    faults_.connections_broken();
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

  // A lock's queue as it is, bypassing faults and counters: for tests.
  struct QueueEntry {
    std::int64_t ticket = 0;
    GrantToken token = 0;
    std::string instance_id;
    std::string connection;
    Fence offered_fence = 0;
    std::chrono::nanoseconds offered_until{};  // server time
    bool alive = true;
  };
  [[nodiscard]] std::vector<QueueEntry> peek_queue(LockRef lock_ref) const {
    detail::LightLock lock(mutex_);
    std::vector<QueueEntry> out;
    const auto table = tables_.find(table_key(lock_ref.table));
    if (table == tables_.end()) return out;
    const auto queue = table->second.queues.find(lock_ref.lock_name);
    if (queue == table->second.queues.end()) return out;
    for (const detail::Waiter& w : queue->second.waiters)
      out.push_back({w.ticket, w.token, w.instance_id, w.connection, w.offered_fence, w.offered_until, alive(w)});
    return out;
  }

  // Every grant the queue made or allowed (recorded once asked for), with the
  // line as it was: for a simulation's invariants.
  struct QueueGrant {
    std::string table;  // as Postgres names it
    std::string lock;
    Fence fence = 0;
    std::int64_t ticket = 0;  // the waiter it went to (0: a plain try)
    bool offered = false;     // an offer (else granted directly)
    std::vector<std::int64_t> live_before;  // the live waiters not offered anything, in ticket order
    std::chrono::nanoseconds at{};           // server time
  };
  void record_queue_grants(bool on) {
    detail::LightLock lock(mutex_);
    record_grants_ = on;
  }
  std::vector<QueueGrant> take_queue_grants() {
    detail::LightLock lock(mutex_);
    return std::exchange(grants_, {});
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
    // The LockRef::identity of the mutex that the strings above came from
    // (0: unknown); a grant to the same mutex leaves them as they are.
    std::uint64_t holder_identity = 0;
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
    // Waiters in line, per lock (a lock whose line emptied keeps its entry),
    // and how many in all: 0 keeps an uncontended cycle on its fast path.
    std::unordered_map<std::string, detail::WaiterQueue, StringHash, std::equal_to<>> queues;
    std::size_t waiting = 0;
    std::int64_t last_ticket = 0;  // like the queue's identity column
    // Elections, per lock (memory/elections.hpp): kept while nobody leads.
    std::unordered_map<std::string, detail::ElectionEntry, StringHash, std::equal_to<>> elections;
  };

  // Called with mutex_ held: a waiter lives while its connection is open.
  bool alive(const detail::Waiter& w) const { return !faults_.killed(w.connection); }

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
  PGMUTEX_ALWAYS_INLINE void delay() {
    const std::chrono::nanoseconds latency(latency_.load(std::memory_order_relaxed));
    if (latency > std::chrono::nanoseconds::zero()) [[unlikely]]
      sleeper_(latency);
  }

  // Called before an operation takes mutex_: waits while its connection
  // hangs (detail/hung_connections.hpp). An error if its timeout passed first.
  PGMUTEX_ALWAYS_INLINE bool any_hung() const noexcept { return hung_.any(); }
  std::optional<Error> wait_if_hung(std::string_view connection, std::chrono::nanoseconds timeout) {
    return hung_.wait_if_hung(connection, timeout);
  }

  // Called with mutex_ held: decides the fate of one operation before it runs.
  // Returns an error to report instead of running it, or nothing.
  PGMUTEX_ALWAYS_INLINE std::optional<Error> admit(std::string_view connection) {
    ++operations_;
    return faults_.admit(connection);
  }
  // Called with mutex_ held after an operation was applied.
  PGMUTEX_ALWAYS_INLINE bool reply_lost() { return faults_.reply_lost(); }

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

  // Virtual time is read directly: a std::function call per statement
  // showed in the in-memory cycle's cost.
  PGMUTEX_ALWAYS_INLINE std::chrono::nanoseconds now() const {
    if (virtual_clock_) return virtual_clock_->now().time_since_epoch() + offset_;
    return time_() + offset_;
  }

  // Called with mutex_ held, by a confirm of `place`'s offer of `row`
  // (table `table`, lock `lock_name`) at `now`, before it writes: the bound
  // of the grant it makes if it commits asynchronously, noted for restart();
  // zero if it commits synchronously.
  std::chrono::nanoseconds unflushed_confirm(std::string_view table, std::string_view lock_name,
                                             const detail::Waiter& place, const Row& row, std::chrono::nanoseconds now) {
    if (!unflushed_window_ || flush_delay_ <= std::chrono::nanoseconds::zero()) [[likely]]
      return {};
    const auto left = std::min(place.offered_until, row.last_heartbeat + row.stale_threshold) - now;
    if (left <= std::chrono::nanoseconds::zero() || left < *unflushed_window_) return {};
    unflushed_confirms_.push_back(UnflushedConfirm{std::string(table), std::string(lock_name), place, now});
    ++unflushed_counts_.made;
    return left;
  }
  // Called with mutex_ held, by restart(): the places of confirms that were
  // not durable yet come back, offered, where the row still carries the offer
  // (every other write to it since committed synchronously, making them durable).
  void bring_back_unflushed_confirms() {
    for (const UnflushedConfirm& c : unflushed_confirms_) {
      if (durable(c.at)) continue;
      const auto t = tables_.find(c.table);
      if (t == tables_.end()) continue;
      const auto r = t->second.rows.find(c.lock_name);
      if (r == t->second.rows.end() || !r->second.present || r->second.fence != c.place.offered_fence ||
          r->second.token != c.place.token)
        continue;
      auto q = t->second.queues.find(c.lock_name);
      if (q == t->second.queues.end()) q = t->second.queues.emplace(c.lock_name, detail::WaiterQueue{}).first;
      auto& waiters = q->second.waiters;
      if (q->second.find(c.place.ticket) != nullptr) continue;
      waiters.insert(std::ranges::lower_bound(waiters, c.place.ticket, {}, &detail::Waiter::ticket), c.place);
      ++t->second.waiting;
      ++unflushed_counts_.taken_back;
    }
    unflushed_confirms_.clear();
  }

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
  PGMUTEX_ALWAYS_INLINE void flush() {
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
  std::optional<testing::ManualClock> virtual_clock_;  // set when time_ reads one: now() reads it directly
  Sleeper sleeper_;
  std::chrono::system_clock::time_point epoch_ = std::chrono::sys_days{std::chrono::year{2026} / 1 / 1};
  std::unordered_map<std::string, Table, StringHash, std::equal_to<>> tables_;
  std::uint64_t operations_ = 0;
  detail::FaultPlan faults_;
  std::string last_table_name_;  // the name last looked up, as the caller spelled it (its table's address: last_table_)
  Table* last_table_ = nullptr;
  std::atomic<std::chrono::nanoseconds::rep> latency_{0};  // read without mutex_, by delay()
  std::chrono::nanoseconds offset_{};
  std::optional<std::chrono::nanoseconds> failover_grace_;  // see set_failover_grace
  std::chrono::nanoseconds flush_delay_{};  // zero: heartbeats commit synchronously
  std::chrono::nanoseconds last_flush_{};
  std::optional<std::chrono::nanoseconds> unflushed_window_;  // see set_unflushed_confirms
  // A confirm committed asynchronously: where, the place it took out, when.
  struct UnflushedConfirm {
    std::string table;
    std::string lock_name;
    detail::Waiter place;
    std::chrono::nanoseconds at{};
  };
  std::vector<UnflushedConfirm> unflushed_confirms_;  // since the last restart
  UnflushedConfirmCounts unflushed_counts_;
  // restart()s and fail_over()s so far: the server session. Changed with
  // mutex_ held; read without it, like history_ (a session read per acquire).
  std::atomic<std::uint64_t> restarts_{0};
  // fail_over()s so far. Changed with mutex_ held; read without it too, so
  // that asking for it costs an acquire/release cycle no lock.
  std::atomic<std::uint64_t> history_{0};
  std::unordered_map<std::string, Table, StringHash, std::equal_to<>> standby_;  // replicate()'s copy
  detail::HungConnections hung_;
  bool record_grants_ = false;
  std::vector<QueueGrant> grants_;
};

}  // namespace pgmutex
