// The operations, each written once against a Session (own libpq connection
// or a borrowed libpqxx one), serialized per backend, bounded by a deadline.
#include "pgmutex/postgres_backend.hpp"

#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include <unistd.h>

#include "dsn.hpp"
#include "error_mapping.hpp"
#include "own_session.hpp"
#include "pgmutex/options.hpp"
#include "pooled_session.hpp"
#include "shared_connection.hpp"
#include "sql.hpp"

namespace pgmutex {

using namespace postgres_detail;

namespace {

// A raced losing try (the row it saw was released, or taken over by another
// reclaimer) is tried again this many times, so that it names the current
// holder, never one that is gone.
constexpr int acquire_tries = 3;

// Without LISTEN (unnamed statements), a wait for release reads the row: the
// first read this long into the wait, each next one twice as long after the
// last, up to max_poll; the backoff carries on over the waits of one lock
// while its holder stays the same.
constexpr std::chrono::nanoseconds first_poll = std::chrono::milliseconds(25);
constexpr std::chrono::nanoseconds max_poll = std::chrono::seconds(1);
constexpr std::size_t max_polled_locks = 256;

// Postgres array literal {"a","b"} for text[] parameters.
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

// The token is stored as BIGINT: the same 64 bits, read as signed.
std::string token_param(GrantToken token) { return std::to_string(std::bit_cast<std::int64_t>(token)); }
GrantToken token_of(const std::string& text) {
  return std::bit_cast<GrantToken>(static_cast<std::int64_t>(std::strtoll(text.c_str(), nullptr, 10)));
}
// A heartbeat key by view, to fold a batch's repeated keys.
struct KeyView {
  std::string_view name, instance;
  Fence fence;
  GrantToken token;
  bool operator==(const KeyView&) const = default;
};
struct KeyViewHash {
  std::size_t operator()(const KeyView& k) const noexcept {
    std::size_t h = std::hash<std::string_view>{}(k.name);
    for (std::size_t part : {std::hash<std::string_view>{}(k.instance), std::hash<Fence>{}(k.fence),
                             std::hash<GrantToken>{}(k.token)})
      h = h * 1099511628211ULL ^ part;
    return h;
  }
};

Fence fence_of(const std::string& text) { return static_cast<Fence>(std::strtoll(text.c_str(), nullptr, 10)); }
double double_of(const std::string& text) { return std::strtod(text.c_str(), nullptr); }

// A row read with sql.cpp's row_columns.
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

std::string this_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return {};
  return name;
}

std::string lock_context(LockRef lock) { return "lock '" + std::string(lock.lock_name) + "'"; }

// A refusal (42501) of a statement on `table`: the GRANTs that fix it, for the
// role the connection logged in as.
void name_the_grants(StatementFailure& failure, std::string_view table, const std::string& role) {
  if (failure.kind != StatementFailure::Kind::server || failure.sqlstate != "42501" || !failure.hint.empty() ||
      table.empty())
    return;
  const std::string r = role.empty() ? "ROLE" : sql_identifier(role);
  failure.hint = "role " + r + " needs SELECT, INSERT, UPDATE, DELETE on the lock table " + sql_table(table) +
                 " and USAGE on its sequence " + sql_fence_sequence(table) + "; as their owner, run: GRANT SELECT, "
                 "INSERT, UPDATE, DELETE ON " + sql_table(table) + " TO " + r + "; GRANT USAGE ON SEQUENCE " +
                 sql_fence_sequence(table) + " TO " + r;
}

tl::unexpected<Error> moved_from() { return fail(Errc::invalid_argument, "this PostgresBackend was moved from"); }

// A heartbeat or release that matched no row: the grant is gone.
tl::unexpected<Error> no_row_for(const HolderKey& key) {
  return fail(Errc::lock_not_held, lock_context(key.lock) + " has no row for instance '" +
                                       std::string(key.instance_id) + "' with fence " + std::to_string(key.fence) +
                                       " and this grant's token");
}

// How a heartbeat's rows say it was committed. `synchronous`: it waited for
// the WAL flush. Otherwise its rows carry wal_before and wal_flushed from
// column `first` on (one value per statement, repeated per row): the
// largest wal_before and the smallest wal_flushed are kept, which can only
// delay a confirmation. No row: nothing told (0), nothing confirmed.
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

}  // namespace

struct PostgresBackend::Impl {
  Impl(const std::string& dsn, PostgresOptions opts)
      : redacted(redact_dsn(dsn)), secrets(secrets_of(dsn)), options(opts) {
    own.emplace(with_network_timeout(with_connect_timeout(dsn, opts.connect_timeout), opts.network_timeout),
                redacted, secrets, opts);
  }
  Impl(std::shared_ptr<ConnectionSource> source, PostgresOptions opts)
      : redacted("(connection pool)"), options(opts), pool(std::move(source)) {}
  // Shared session: each operation's body runs on the session's I/O thread,
  // against its one connection (pgmutex::Session).
  Impl(std::shared_ptr<SharedConnection> session_core, std::shared_ptr<DurableMark> durable_mark)
      : redacted(session_core->redacted()),
        secrets(session_core->secrets()),
        options(session_core->postgres_options()),
        core(std::move(session_core)),
        mark(std::move(durable_mark)) {}

  std::string redacted;
  std::vector<std::string> secrets;
  PostgresOptions options;
  std::string host = this_host();  // stored with each grant, unless the request names one
  std::shared_ptr<ConnectionSource> pool;  // set: borrow per operation; else `own`
  std::optional<OwnSession> own;
  std::shared_ptr<SharedConnection> core;  // set: a shared session's (neither `pool` nor `own`)
  std::shared_ptr<DurableMark> mark;  // with `core`: this backend's last durable write

  std::mutex mutex;  // one operation at a time: a connection never serves two threads at once
  std::uint64_t last_session = 0;  // the server session the last operation ran on (see session())
  std::uint64_t last_history = 0;  // the server history the last operation ran on (see history())
  HeartbeatDurability last_durability{};  // of the last heartbeat (see last_heartbeat_durability())
  // Keyed by table and commit mode: a connection behind a pooler (unnamed
  // statements) commits heartbeats synchronously, another may not.
  std::map<std::string, TableStatements, std::less<>> tables;
  // Whether the last connection used unnamed statements (read without the mutex).
  std::atomic<bool> unnamed_in_use{false};

  // The wait for release of one lock without LISTEN: the holder last seen
  // and the backoff reached (see first_poll).
  struct Poll {
    std::string instance;
    Fence fence = 0;
    std::chrono::nanoseconds delay = first_poll;
  };
  std::map<std::string, Poll, std::less<>> polls;

  [[nodiscard]] bool unnamed_mode() const noexcept {
    switch (options.statement_mode) {
      case StatementMode::unnamed: return true;
      case StatementMode::prepared: return false;
      case StatementMode::automatic: return !pool && unnamed_in_use.load();  // own or shared
    }
    return false;
  }

  // `table` must have passed validate_table_name.
  const TableStatements& statements(std::string_view table, bool unnamed) {
    const bool async = options.heartbeat_synchronous_commit_off && !unnamed;
    const std::string key = std::string(table) + (async ? "/async" : "/sync");
    if (const auto found = tables.find(key); found != tables.end()) return found->second;
    return tables.emplace(key, make_statements(table, async)).first->second;
  }

  // $9 of the acquire: "-1" for the default grace, "0" off.
  [[nodiscard]] std::string grace_param() const {
    if (!options.failover_grace) return "-1";
    return seconds_param(std::max(*options.failover_grace, std::chrono::nanoseconds::zero()));
  }

  [[nodiscard]] std::chrono::nanoseconds bound_of(std::chrono::nanoseconds timeout) const {
    return timeout > std::chrono::nanoseconds::zero() ? timeout : options.default_timeout;
  }

  // Runs one operation within `bound`. An operation whose connection broke
  // under it is tried once more on a fresh one if that is safe (a read, an
  // idempotent write, or a write that surely did not run) and time is left;
  // otherwise a write's outcome is reported unknown, and the caller resolves
  // it by reading the row back.
  // A refusal (42501) of a statement on `table` names the GRANTs that fix it.
  template <class T, class Body>
  Result<T> run(std::string_view what, Effect effect, const Bound& bound, Body&& body,
                std::string_view table = {}) noexcept {
    try {
      for (int attempt = 0;; ++attempt) {
        Outcome<T> outcome = tl::unexpected(StatementFailure{});
        if (pool) {
          auto session = PooledSession::borrow(*pool, secrets, options.statement_mode == StatementMode::unnamed);
          if (!session) return tl::unexpected(std::move(session.error()));
          outcome = body(**session, bound);
          last_session = (*session)->server_pid() << 1 | 1;  // odd: a pid, never a count
          if (!outcome) name_the_grants(outcome.error(), table, (*session)->user());
        } else if (core) {
          // The caller waits while the body runs on the session's thread, so
          // the body's references stay good; a body still queued at the
          // deadline is taken out and never runs.
          std::optional<Error> refused;
          const bool ran = core->call(
              [&](OwnSession& shared) {
                if (auto r = run_own(shared, bound, body, outcome, table); !r) refused = std::move(r.error());
              },
              bound.deadline);
          if (!ran)
            return fail(Errc::backend_unavailable,
                        std::string(what) + ": the session's connection was busy until the deadline (or the session stopped)");
          if (refused) return tl::unexpected(std::move(*refused));
        } else {
          if (auto r = run_own(*own, bound, body, outcome, table); !r) return tl::unexpected(std::move(r.error()));
        }
        if (outcome) {
          if constexpr (std::is_void_v<T>) return {};
          else return std::move(*outcome);
        }
        if (attempt == 0 && may_retry(outcome.error(), effect) && std::chrono::steady_clock::now() < bound.deadline)
          continue;
        return tl::unexpected(to_error(outcome.error(), what, effect, secrets));
      }
    } catch (...) {
      return tl::unexpected(to_error(failure_from_current_exception(), what, effect, secrets));
    }
  }

  // One try of an operation on our own (or the session's) connection.
  template <class T, class Body>
  Result<void> run_own(OwnSession& session, const Bound& bound, Body& body, Outcome<T>& outcome,
                       std::string_view table) {
    if (auto connected = session.ensure_connected(bound.deadline); !connected)
      return tl::unexpected(std::move(connected.error()));
    unnamed_in_use = session.unnamed();
    outcome = body(session, bound);
    last_session = session.connects() << 1;
    last_history = session.history().history();
    if (!outcome) name_the_grants(outcome.error(), table, session.user());
    if (!outcome && connection_gone(outcome.error())) session.drop();
    return {};
  }

  // Whether this heartbeat must commit synchronously (the first after a new
  // server history, see BackendReportsHistory), and the note that one did.
  // A shared session decides per backend (DurableMark); an own connection
  // per connection, which is the same thing.
  bool durable_due(Session& session) {
    auto* own_session = dynamic_cast<OwnSession*>(&session);
    if (own_session == nullptr) return false;
    if (mark) return mark->due(own_session->history().history());
    return own_session->history().durable_heartbeat_due();
  }
  void durable_done(Session& session) {
    auto* own_session = dynamic_cast<OwnSession*>(&session);
    if (own_session == nullptr) return;
    if (mark) mark->history = own_session->history().history();
    else own_session->history().durable_heartbeat_done();
  }

  // One operation on `table`: serialized with every other operation of this
  // backend, the table's statements made (and its name checked) first.
  template <class T, class Body>
  Result<T> on_table(std::string_view table, std::string_view what, Effect effect, std::chrono::nanoseconds timeout,
                     Body&& body) noexcept {
    if (auto valid = validate_table_name(table); !valid) return tl::unexpected(std::move(valid.error()));
    std::lock_guard lock(mutex);
    return run<T>(
        what, effect, Bound::from(bound_of(timeout)),
        [&](Session& session, const Bound& bound) { return body(session, bound, statements(table, session.unnamed())); },
        table);
  }

  // wait_for_release without LISTEN: reads the row (see first_poll) until it
  // is gone or another grant holds it (true), or `wait_until` (false).
  Outcome<bool> poll_release(Session& session, const TableStatements& st, LockRef lock_ref, Deadline wait_until) {
    std::string key = std::string(lock_ref.table);
    key.push_back('\0');
    key += lock_ref.lock_name;
    if (polls.size() >= max_polled_locks && !polls.contains(key)) polls.clear();
    Poll& poll = polls[key];
    for (;;) {
      const auto left = wait_until - std::chrono::steady_clock::now();
      if (left <= std::chrono::nanoseconds::zero()) return false;
      if (left < poll.delay) {
        std::this_thread::sleep_for(left);
        return false;
      }
      std::this_thread::sleep_for(poll.delay);
      poll.delay = std::min(poll.delay * 2, max_poll);
      auto rows = session.run(st.inspect, {std::string(lock_ref.lock_name)}, Bound::from(bound_of({})));
      if (!rows) return tl::unexpected(std::move(rows.error()));
      const bool gone = rows->empty();
      const LockRow row = gone ? LockRow{} : row_from(*rows, 0);
      if (gone || (!poll.instance.empty() && (row.instance_id != poll.instance || row.fence != poll.fence))) {
        polls.erase(key);
        return true;
      }
      poll.instance = row.instance_id;
      poll.fence = row.fence;
    }
  }

  // One try, read as the statement returns it: ins fence, upd fence, then the row it saw.
  static AcquireResult read_acquire(const Rows& rows, bool& raced) {
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
    return out;
  }
};

// ---- construction ---------------------------------------------------------

PostgresBackend::PostgresBackend(std::string dsn, PostgresOptions options)
    : impl_(std::make_unique<Impl>(dsn, options)) {}
PostgresBackend::PostgresBackend(std::shared_ptr<ConnectionSource> pool, PostgresOptions options)
    : impl_(std::make_unique<Impl>(std::move(pool), options)) {}
PostgresBackend::PostgresBackend(PostgresBackend&&) noexcept = default;
PostgresBackend& PostgresBackend::operator=(PostgresBackend&&) noexcept = default;
PostgresBackend::~PostgresBackend() = default;

std::string PostgresBackend::redacted_dsn() const { return impl_ ? impl_->redacted : std::string(); }

bool PostgresBackend::heartbeat_commits_asynchronously() const noexcept {
  return impl_ && impl_->options.heartbeat_synchronous_commit_off && !impl_->unnamed_mode();
}

bool PostgresBackend::uses_unnamed_statements() const noexcept { return impl_ && impl_->unnamed_mode(); }

Result<void> PostgresBackend::connect() noexcept {
  if (!impl_) return moved_from();
  std::lock_guard lock(impl_->mutex);
  return impl_->run<void>("connect", Effect::read, Bound::from(impl_->bound_of({})),
                          [](Session&, const Bound&) -> Outcome<void> { return {}; });
}

Result<std::string> PostgresBackend::release_channel(LockRef lock_ref) noexcept {
  if (!impl_) return moved_from();
  if (auto valid = validate_table_name(lock_ref.table); !valid) return tl::unexpected(std::move(valid.error()));
  std::lock_guard lock(impl_->mutex);
  return impl_->run<std::string>(
      "release channel of " + lock_context(lock_ref), Effect::read, Bound::from(impl_->bound_of({})),
      [&](Session& session, const Bound& bound) -> Outcome<std::string> {
        auto oid = session.table_oid(lock_ref.table, bound);
        if (!oid) return tl::unexpected(std::move(oid.error()));
        return postgres_detail::release_channel(*oid, lock_ref.lock_name);
      });
}

// ---- the Backend contract ---------------------------------------------------

namespace {

// create_schema was refused (42501): which privilege is missing, and the
// GRANT that fixes it. Asks the server which schema the table goes to and
// whether the role may create in it; empty if that cannot be told.
std::string missing_create_privilege(Session& session, std::string_view table, const Bound& bound) {
  const auto dot = table.find('.');
  const std::string given = dot == std::string_view::npos ? std::string() : std::string(table.substr(0, dot));
  auto rows = session.run_text(
      "SELECT s, has_schema_privilege(s, 'CREATE') FROM"
      " (SELECT coalesce(nullif($1::text, ''), current_schema(), 'public') AS s) AS x",
      {given}, bound);
  if (!rows || rows->empty() || rows->is_null(0, 1)) return {};
  const std::string schema = sql_identifier(rows->text(0, 0));
  const std::string role = sql_identifier(session.user());
  if (rows->text(0, 1) == "f")
    return "role " + role + " lacks CREATE on schema " + schema + ", which creating the lock table " +
           sql_table(table) + " and its sequence needs; as an owner of the schema, run: GRANT CREATE ON SCHEMA " +
           schema + " TO " + role + "; or have an owner run create_schema() (pgmutex schema)";
  return "role " + role + " may create in schema " + schema + ", but the lock table " + sql_table(table) +
         " or its sequence belongs to another role and needs an upgrade only its owner may make: have the owner run "
         "create_schema() (pgmutex schema)";
}

}  // namespace

Result<void> PostgresBackend::create_schema(std::string_view table) noexcept {
  if (!impl_) return moved_from();
  if (auto valid = validate_table_name(table); !valid) return valid;
  std::lock_guard lock(impl_->mutex);
  return impl_->run<void>(
      "create_schema('" + std::string(table) + "')", Effect::idempotent_write, Bound::from(impl_->bound_of({})),
      [&](Session& session, const Bound& bound) -> Outcome<void> {
        auto done = session.run_text(create_schema_sql(table), {}, bound);
        if (done) return {};
        StatementFailure failure = std::move(done.error());
        if (failure.kind == StatementFailure::Kind::server && failure.sqlstate == "42501")
          failure.hint = missing_create_privilege(session, table, bound);
        return tl::unexpected(std::move(failure));
      });
}

Result<AcquireResult> PostgresBackend::try_acquire(const AcquireRequest& request) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<AcquireResult>(
      request.lock.table, "acquire " + lock_context(request.lock), Effect::write, request.timeout,
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<AcquireResult> {
        const HolderDetails& given = request.holder_details;
        const std::vector<std::string> params{
            std::string(request.lock.lock_name), std::string(request.instance_id),
            seconds_param(request.stale_threshold), token_param(request.token), bound.lock_timeout_param(),
            given.host.empty() ? impl_->host : std::string(given.host),
            std::to_string(given.pid != 0 ? given.pid : static_cast<std::int64_t>(::getpid())),
            given.command.empty() ? impl_->options.holder_command : std::string(given.command),
            impl_->grace_param()};
        AcquireResult out;
        for (int attempt = 0; attempt < acquire_tries; ++attempt) {
          // Each try that lost changed nothing, so trying again is safe.
          auto rows = session.run(st.acquire, params, bound);
          if (!rows) return tl::unexpected(std::move(rows.error()));
          bool raced = false;
          out = Impl::read_acquire(*rows, raced);
          if (out.acquired && impl_->mark) impl_->durable_done(session);  // an acquire commits synchronously
          if (out.acquired || !raced) return out;
          if (std::chrono::steady_clock::now() >= bound.deadline) break;
        }
        // Still racing: report whoever holds it now, if anyone.
        auto now = session.run(st.inspect, {std::string(request.lock.lock_name)}, bound);
        if (!now) return tl::unexpected(std::move(now.error()));
        out = AcquireResult{};
        if (!now->empty()) {
          const LockRow row = row_from(*now, 0);
          out.holder = row.instance_id;
          out.fence = row.fence;
          out.holder_age_s = row.seconds_since_heartbeat;
          out.holder_token = row.token;
        }
        return out;
      });
}

Result<void> PostgresBackend::heartbeat(const HolderKey& key) noexcept {
  if (!impl_) return moved_from();
  auto changed = impl_->on_table<long>(
      key.lock.table, "heartbeat " + lock_context(key.lock), Effect::idempotent_write, key.timeout,
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<long> {
        // After a failover the first heartbeat commits synchronously: the
        // mutex counts the lease from it alone (BackendReportsHistory).
        const bool durable = key.durable || impl_->durable_due(session);
        auto rows = session.run(durable ? st.heartbeat_durable : st.heartbeat,
                                {std::string(key.lock.lock_name), std::string(key.instance_id),
                                 std::to_string(key.fence), token_param(key.token), bound.lock_timeout_param()},
                                bound);
        if (!rows) return tl::unexpected(std::move(rows.error()));
        if (durable) impl_->durable_done(session);
        impl_->last_durability = durability_of(*rows, durable || !st.asynchronous, 0);
        return rows->affected;
      });
  if (!changed) return tl::unexpected(std::move(changed.error()));
  if (*changed == 0) return no_row_for(key);
  return {};
}

Result<void> PostgresBackend::release(const HolderKey& key) noexcept {
  if (!impl_) return moved_from();
  auto removed = impl_->on_table<bool>(
      key.lock.table, "release " + lock_context(key.lock), Effect::write, key.timeout,
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<bool> {
        auto rows = session.run(st.release,
                                {std::string(key.lock.lock_name), std::string(key.instance_id),
                                 std::to_string(key.fence), token_param(key.token), lock_hash(key.lock.lock_name),
                                 bound.lock_timeout_param()},
                                bound);
        if (!rows) return tl::unexpected(std::move(rows.error()));
        return !rows->empty();
      });
  if (!removed) return tl::unexpected(std::move(removed.error()));
  if (!*removed) return no_row_for(key);
  return {};
}

Result<std::optional<LockRow>> PostgresBackend::inspect(LockRef lock_ref) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<std::optional<LockRow>>(
      lock_ref.table, "inspect " + lock_context(lock_ref), Effect::read, {},
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<std::optional<LockRow>> {
        auto rows = session.run(st.inspect, {std::string(lock_ref.lock_name)}, bound);
        if (!rows) return tl::unexpected(std::move(rows.error()));
        if (rows->empty()) return std::optional<LockRow>{};
        return std::optional<LockRow>{row_from(*rows, 0)};
      });
}

Result<std::vector<LockRow>> PostgresBackend::list(std::string_view table) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<std::vector<LockRow>>(
      table, "list locks in '" + std::string(table) + "'", Effect::read, {},
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<std::vector<LockRow>> {
        auto rows = session.run(st.list, {}, bound);
        if (!rows) return tl::unexpected(std::move(rows.error()));
        std::vector<LockRow> out;
        out.reserve(rows->size());
        for (std::size_t r = 0; r < rows->size(); ++r) out.push_back(row_from(*rows, r));
        return out;
      });
}

Result<std::optional<LockRow>> PostgresBackend::force_release(LockRef lock_ref) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<std::optional<LockRow>>(
      lock_ref.table, "force-release " + lock_context(lock_ref), Effect::write, {},
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<std::optional<LockRow>> {
        auto rows = session.run(
            st.force_release, {std::string(lock_ref.lock_name), lock_hash(lock_ref.lock_name), bound.lock_timeout_param()},
            bound);
        if (!rows) return tl::unexpected(std::move(rows.error()));
        if (rows->empty()) return std::optional<LockRow>{};
        return std::optional<LockRow>{row_from(*rows, 0)};
      });
}

// ---- optional operations ------------------------------------------------------

Result<bool> PostgresBackend::wait_for_release(LockRef lock_ref, std::chrono::nanoseconds timeout) noexcept {
  if (!impl_) return moved_from();
  if (auto valid = validate_table_name(lock_ref.table); !valid) return tl::unexpected(std::move(valid.error()));
  std::lock_guard lock(impl_->mutex);
  const Deadline wait_until = std::chrono::steady_clock::now() + std::max(timeout, std::chrono::nanoseconds::zero());
  // The oid lookup and the LISTEN get the default bound; the wait itself ends at `timeout`.
  return impl_->run<bool>(
      "wait for release of " + lock_context(lock_ref), Effect::read, Bound::from(impl_->bound_of({})),
      [&](Session& session, const Bound& bound) -> Outcome<bool> {
        // No LISTEN behind a transaction pooler: the row is read instead.
        if (session.unnamed())
          return impl_->poll_release(session, impl_->statements(lock_ref.table, true), lock_ref, wait_until);
        auto oid = session.table_oid(lock_ref.table, bound);
        if (!oid) return tl::unexpected(std::move(oid.error()));
        return session.wait_for_notification(postgres_detail::release_channel(*oid, lock_ref.lock_name), bound,
                                             wait_until);
      },
      lock_ref.table);
}

Result<std::vector<bool>> PostgresBackend::heartbeat_many(std::span<const HolderKey> keys) noexcept {
  return heartbeat_many_of(impl_.get(), keys, false, false);
}

// `durable`: commit synchronously whatever the options say (a session's batch
// that carries a heartbeat due to be durable). `skip_locked`: a row another
// transaction locked is reported false instead of waited for.
Result<std::vector<bool>> PostgresBackend::heartbeat_many_of(Impl* impl, std::span<const HolderKey> keys,
                                                            bool durable, bool skip_locked) noexcept {
  if (impl == nullptr) return moved_from();
  const auto& impl_ = impl;
  std::vector<bool> held(keys.size(), false);
  if (keys.empty()) return held;
  try {
    std::lock_guard lock(impl_->mutex);
    // One statement per table (usually exactly one), bounded by the longest timeout asked for.
    std::set<std::string_view> tables;
    std::chrono::nanoseconds timeout{0};
    for (const HolderKey& key : keys) {
      tables.insert(key.lock.table);
      timeout = std::max(timeout, key.timeout);
      durable = durable || key.durable;  // one asks: the statement commits synchronously for all
    }
    for (std::string_view table : tables) {
      if (auto valid = validate_table_name(table); !valid) return tl::unexpected(std::move(valid.error()));
      // Each distinct key is sent once (the statement answers a key by its
      // position, and a row joined to two equal keys is returned once); a
      // repeated key gets its first copy's answer.
      std::vector<std::string_view> names, instances;
      std::vector<std::pair<std::size_t, std::size_t>> sent_as;  // (index in keys, position in the arrays)
      std::unordered_map<KeyView, std::size_t, KeyViewHash> position;
      std::string fences = "{", tokens = "{";
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (keys[i].lock.table != table) continue;
        const auto [at, fresh] = position.try_emplace(
            KeyView{keys[i].lock.lock_name, keys[i].instance_id, keys[i].fence, keys[i].token}, names.size());
        sent_as.emplace_back(i, at->second);
        if (!fresh) continue;
        names.push_back(keys[i].lock.lock_name);
        instances.push_back(keys[i].instance_id);
        if (fences.size() > 1) {
          fences.push_back(',');
          tokens.push_back(',');
        }
        fences += std::to_string(keys[i].fence);
        tokens += token_param(keys[i].token);
      }
      fences.push_back('}');
      tokens.push_back('}');
      auto beaten = impl_->run<std::vector<bool>>(
          "heartbeat " + std::to_string(sent_as.size()) + " locks in '" + std::string(table) + "'",
          Effect::idempotent_write, Bound::from(impl_->bound_of(timeout)),
          [&](Session& session, const Bound& bound) -> Outcome<std::vector<bool>> {
            const bool sync = durable || (impl_->mark && impl_->durable_due(session));
            const TableStatements& st = impl_->statements(table, session.unnamed() || sync);
            auto rows = session.run(skip_locked ? st.heartbeat_many_skip_locked : st.heartbeat_many,
                                    {text_array(names), text_array(instances), fences, tokens, bound.lock_timeout_param()},
                                    bound);
            if (!rows) return tl::unexpected(std::move(rows.error()));
            if (sync && impl_->mark) impl_->durable_done(session);
            impl_->last_durability = durability_of(*rows, !st.asynchronous, 1);
            std::vector<bool> out(names.size(), false);
            for (std::size_t r = 0; r < rows->size(); ++r) {
              const auto at = std::strtoull(rows->text(r, 0).c_str(), nullptr, 10);  // 1-based
              if (at >= 1 && at <= out.size()) out[at - 1] = true;
            }
            return out;
          },
          table);
      if (!beaten) return tl::unexpected(std::move(beaten.error()));
      for (const auto& [i, at] : sent_as) held[i] = (*beaten)[at];
    }
    return held;
  } catch (...) {
    return tl::unexpected(
        to_error(failure_from_current_exception(), "heartbeat_many", Effect::idempotent_write, impl_->secrets));
  }
}

HeartbeatDurability PostgresBackend::last_heartbeat_durability() const noexcept {
  if (!impl_) return {};
  std::lock_guard lock(impl_->mutex);
  return impl_->last_durability;
}

std::uint64_t PostgresBackend::session() const noexcept {
  if (!impl_) return 0;
  std::lock_guard lock(impl_->mutex);
  return impl_->last_session;
}

static_assert(Backend<PostgresBackend>);
std::uint64_t PostgresBackend::history() const noexcept {
  if (!impl_) return 0;
  std::lock_guard lock(impl_->mutex);
  return impl_->last_history;
}

std::string PostgresBackend::server_identity() const {
  if (!impl_ || !impl_->own) return {};
  std::lock_guard lock(impl_->mutex);
  return impl_->own->history().identity();
}

static_assert(BackendReportsSession<PostgresBackend>);
static_assert(BackendReportsHistory<PostgresBackend>);
static_assert(BackendWaitsForRelease<PostgresBackend>);
static_assert(BackendBatchesHeartbeats<PostgresBackend>);
static_assert(BackendReportsCommitMode<PostgresBackend>);
static_assert(BackendReportsDurability<PostgresBackend>);

}  // namespace pgmutex

// ---- a pgmutex::Session's access ---------------------------------------------

namespace pgmutex {

PostgresBackend::PostgresBackend(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}

namespace postgres_detail {

PostgresBackend SharedAccess::make(std::shared_ptr<SharedConnection> core, std::shared_ptr<DurableMark> mark) {
  return PostgresBackend(std::make_unique<PostgresBackend::Impl>(std::move(core), std::move(mark)));
}

Result<std::vector<bool>> SharedAccess::heartbeat_many(PostgresBackend& backend, std::span<const HolderKey> keys,
                                                       bool durable, bool skip_locked) noexcept {
  return PostgresBackend::heartbeat_many_of(backend.impl_.get(), keys, durable, skip_locked);
}

Result<std::string> SharedAccess::listen(PostgresBackend& backend, LockRef lock_ref) noexcept {
  auto& impl = backend.impl_;
  if (!impl) return moved_from();
  if (auto valid = validate_table_name(lock_ref.table); !valid) return tl::unexpected(std::move(valid.error()));
  std::lock_guard lock(impl->mutex);
  return impl->run<std::string>(
      "listen for releases of " + lock_context(lock_ref), Effect::read, Bound::from(impl->bound_of({})),
      [&](Session& session, const Bound& bound) -> Outcome<std::string> {
        auto oid = session.table_oid(lock_ref.table, bound);
        if (!oid) return tl::unexpected(std::move(oid.error()));
        std::string channel = postgres_detail::release_channel(*oid, lock_ref.lock_name);
        auto& own_session = dynamic_cast<OwnSession&>(session);
        if (auto listened = own_session.listen(channel, bound); !listened)
          return tl::unexpected(std::move(listened.error()));
        return channel;
      },
      lock_ref.table);
}

}  // namespace postgres_detail
}  // namespace pgmutex
