#include "pgmutex/postgres_backend.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <unordered_set>

#include <libpq-fe.h>
#include <pqxx/pqxx>

#include "dsn.hpp"
#include "pgmutex/options.hpp"
#include "pgmutex/postgres_pool.hpp"
#include "sql.hpp"

namespace pgmutex {

using namespace postgres_detail;

namespace {

// What a statement may have done when its connection dies under it.
enum class Effect {
  read,              // nothing: safe to retry
  idempotent_write,  // applying it twice is harmless (heartbeat, create_schema): retried once
  write,             // the outcome matters and is unknown (acquire, release): never retried here
};

// An exception from libpqxx turned into an Error, and whether the connection is gone.
struct Failure {
  Error error;
  bool connection_lost = false;
};

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  return text;
}

bool is_connection_state(const std::string& state) {
  return state.starts_with("08") || state == "57P01" || state == "57P02" || state == "57P03" || state == "53300";
}

// The one place where libpqxx's exceptions become Errcs: by type, then by
// SQLSTATE. Call it inside a catch block. Messages are scrubbed of secrets.
Failure map_current_exception(std::string_view what, Effect effect, const std::vector<std::string>& secrets) {
  const auto describe = [&](const std::string& detail) {
    return std::string(what) + ": " + scrub(trimmed(detail), secrets);
  };
  try {
    throw;
  } catch (const pqxx::in_doubt_error& e) {
    return {Error(Errc::outcome_unknown, describe(std::string("commit outcome unknown: ") + e.what())), true};
  } catch (const pqxx::broken_connection& e) {
    if (effect == Effect::read)
      return {Error(Errc::backend_unavailable, describe(std::string("connection lost: ") + e.what())), true};
    return {Error(Errc::outcome_unknown,
                  describe(std::string("connection lost while the statement was in flight: ") + e.what())),
            true};
  } catch (const pqxx::sql_error& e) {
    const std::string& state = e.sqlstate();
    const std::string cause = "SQLSTATE " + state + ": " + e.what();
    // The server said why the statement failed, so it was not applied.
    if (is_connection_state(state)) return {Error(Errc::backend_unavailable, describe(cause)), true};
    if (state == "42P01")
      return {Error(Errc::backend_error, describe(cause + " (the lock table does not exist: call create_schema() first)"))};
    if (state == "42703")
      return {Error(Errc::backend_error,
                    describe(cause + " (the lock table lacks a column, e.g. one made by an older version: "
                                     "call create_schema() to upgrade it)"))};
    if (state == "40001" || state == "40P01" || state == "55P03" || state == "57014")
      return {Error(Errc::backend_unavailable, describe(cause))};
    if (state.starts_with("22")) return {Error(Errc::invalid_argument, describe(cause))};
    return {Error(Errc::backend_error, describe(cause))};
  } catch (const pqxx::failure& e) {
    return {Error(Errc::backend_error, describe(e.what()))};
  } catch (const std::bad_alloc&) {
    return {Error(Errc::backend_error, describe("out of memory"))};
  } catch (const std::exception& e) {
    return {Error(Errc::backend_error, describe(e.what()))};
  } catch (...) {
    return {Error(Errc::backend_error, describe("unknown exception"))};
  }
}

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

LockRow row_from(const pqxx::row& row) {
  LockRow out;
  out.lock_name = row[0].as<std::string>();
  out.instance_id = row[1].as<std::string>();
  out.fence = row[2].as<Fence>();
  out.acquired_at = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::microseconds(row[3].as<long long>())));
  out.seconds_since_heartbeat = row[4].as<double>();
  return out;
}

std::string lock_context(LockRef lock) { return "lock '" + std::string(lock.lock_name) + "'"; }

// Notes that a lock's channel was notified by another session than ours.
class ReleaseListener final : public pqxx::notification_receiver {
 public:
  ReleaseListener(pqxx::connection& connection, const std::string& channel)
      : pqxx::notification_receiver(connection, channel), own_pid_(connection.backendpid()) {}
  void operator()(const std::string&, int backend_pid) override {
    if (backend_pid != own_pid_) fired_ = true;
  }
  bool take() noexcept { return std::exchange(fired_, false); }

 private:
  int own_pid_;
  bool fired_ = false;
};

constexpr std::size_t max_cached_listeners = 64;

}  // namespace

struct PostgresBackend::Impl {
  Impl(std::string dsn_text, PostgresOptions opts)
      : dsn(std::move(dsn_text)),
        connect_dsn(with_network_timeout(with_connect_timeout(dsn, opts.connect_timeout), opts.network_timeout)),
        redacted(redact_dsn(dsn)),
        secrets(secrets_of(dsn)),
        options(opts) {}
  Impl(std::shared_ptr<ConnectionSource> source, PostgresOptions opts)
      : redacted("(connection pool)"), options(opts), pool(std::move(source)) {}

  ~Impl() { drop_own(); }

  std::string dsn;
  std::string connect_dsn;
  std::string redacted;
  std::vector<std::string> secrets;
  PostgresOptions options;
  std::shared_ptr<ConnectionSource> pool;  // set: borrow per operation; else own one connection

  std::mutex mutex;  // one operation at a time: a connection never serves two threads at once
  std::unique_ptr<pqxx::connection> own;
  std::unordered_set<std::string> own_prepared;  // statement names given to `own`
  std::map<std::string, std::unique_ptr<ReleaseListener>, std::less<>> listeners;  // on `own`
  std::map<std::string, TableStatements, std::less<>> tables;

  // ---- connections -------------------------------------------------------

  void drop_own() noexcept {
    try {
      listeners.clear();  // before the connection they listen on
    } catch (...) {
    }
    own.reset();
    own_prepared.clear();
  }

  Result<void> ensure_connected() {
    if (own && own->is_open()) return {};
    drop_own();
    // A DSN libpq cannot parse is the caller's mistake, not an outage: say so
    // at once instead of retrying. libpq's message names the bad part.
    char* parse_error = nullptr;
    if (PQconninfoOption* parsed = PQconninfoParse(connect_dsn.c_str(), &parse_error)) {
      PQconninfoFree(parsed);
    } else {
      std::string cause = parse_error != nullptr ? trimmed(parse_error) : "out of memory";
      if (parse_error != nullptr) PQfreemem(parse_error);
      return fail(Errc::invalid_argument, "invalid connection string '" + redacted + "': " + scrub(cause, secrets));
    }
    auto delay = options.reconnect_backoff;
    const int attempts = std::max(1, options.reconnect_attempts);
    Error last;
    for (int attempt = 0; attempt < attempts; ++attempt) {
      if (attempt > 0) {
        std::this_thread::sleep_for(delay);
        delay *= 2;
      }
      try {
        auto connection = std::make_unique<pqxx::connection>(connect_dsn);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        // We reconnect ourselves, with backoff, and re-prepare: libpqxx must not do it behind our back.
        connection->inhibit_reactivation(true);
#pragma GCC diagnostic pop
        own = std::move(connection);
        return {};
      } catch (...) {
        Failure failure = map_current_exception("cannot connect to '" + redacted + "'", Effect::read, secrets);
        last = failure.error;
        if (last.code != make_error_code(Errc::backend_unavailable)) last.code = make_error_code(Errc::backend_unavailable);
      }
    }
    last.detail += " (after " + std::to_string(attempts) + (attempts == 1 ? " attempt)" : " attempts)");
    return tl::unexpected(std::move(last));
  }

  // A connection for one operation: ours, or one borrowed from the pool and
  // given back when the lease ends.
  class Lease {
   public:
    Lease(pqxx::connection* c, ConnectionSource* source) noexcept : connection_(c), source_(source) {}
    Lease(Lease&& other) noexcept
        : connection_(std::exchange(other.connection_, nullptr)), source_(other.source_) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (source_ != nullptr && connection_ != nullptr) source_->give_back(*connection_);
    }
    pqxx::connection& operator*() const noexcept { return *connection_; }
    [[nodiscard]] bool borrowed() const noexcept { return source_ != nullptr; }

   private:
    pqxx::connection* connection_;
    ConnectionSource* source_;
  };

  Result<Lease> lease() {
    if (pool) {
      try {
        return Lease(&pool->borrow(), pool.get());
      } catch (...) {
        Failure failure = map_current_exception("cannot borrow a connection from the pool", Effect::read, secrets);
        failure.error.code = make_error_code(Errc::backend_unavailable);
        return tl::unexpected(std::move(failure.error));
      }
    }
    if (auto connected = ensure_connected(); !connected) return tl::unexpected(std::move(connected.error()));
    return Lease(own.get(), nullptr);
  }

  void prepare(pqxx::connection& connection, bool borrowed, const Statement& statement) {
    // libpqxx accepts an identical redefinition, so a borrowed connection is
    // simply told again; on our own we remember what it already knows.
    if (borrowed || own_prepared.insert(statement.name).second) connection.prepare(statement.name, statement.sql);
  }

  Result<const TableStatements*> statements(std::string_view table) {
    if (const auto found = tables.find(table); found != tables.end()) return &found->second;
    if (auto valid = validate_table_name(table); !valid) return tl::unexpected(std::move(valid.error()));
    const auto [it, _] =
        tables.emplace(std::string(table), make_statements(table, options.heartbeat_synchronous_commit_off));
    return &it->second;
  }

  // One statement: prepared on this connection if need be, then run outside
  // any explicit transaction (the result outlives the transaction object).
  template <class... Args>
  pqxx::result exec(pqxx::connection& connection, bool borrowed, const Statement& statement, Args&&... args) {
    prepare(connection, borrowed, statement);
    pqxx::nontransaction tx(connection);
    return tx.exec_prepared(statement.name, std::forward<Args>(args)...);
  }

  // One operation on `table`: serialized with every other operation of this
  // backend, the table's statements made (and its name checked) first.
  template <class T, class Body>
  Result<T> on_table(std::string_view table, std::string_view what, Effect effect, Body&& body) noexcept {
    std::lock_guard lock(mutex);
    auto st = statements(table);
    if (!st) return tl::unexpected(std::move(st.error()));
    const TableStatements& statements_of_table = **st;
    return run<T>(what, effect, [&](pqxx::connection& c, bool borrowed) -> Result<T> {
      return body(c, borrowed, statements_of_table);
    });
  }

  // Runs one operation on a connection. A read or an idempotent write whose
  // connection turns out dead (say, the server dropped it while idle) is
  // retried once on a fresh one; a write never is: its outcome is reported
  // unknown, and the caller resolves it by reading the row back.
  template <class T, class Body>
  Result<T> run(std::string_view what, Effect effect, Body&& body) noexcept {
    try {
      const int tries = effect == Effect::write ? 1 : 2;
      Result<T> result = tl::unexpected(Error(Errc::backend_error, std::string(what)));
      for (int attempt = 0; attempt < tries; ++attempt) {
        bool lost = false;
        bool borrowed = false;
        {
          auto connection = lease();
          if (!connection) return tl::unexpected(std::move(connection.error()));
          borrowed = connection->borrowed();
          try {
            return body(**connection, borrowed);
          } catch (...) {
            Failure failure = map_current_exception(what, effect, secrets);
            lost = failure.connection_lost || !(**connection).is_open();
            result = tl::unexpected(std::move(failure.error));
          }
        }  // a borrowed connection goes back to its pool here, dead or alive: the pool decides
        if (!lost) return result;
        if (!borrowed) drop_own();
      }
      return result;
    } catch (...) {
      return tl::unexpected(map_current_exception(what, effect, secrets).error);
    }
  }
};

// ---- construction ---------------------------------------------------------

PostgresBackend::PostgresBackend(std::string dsn, PostgresOptions options)
    : impl_(std::make_unique<Impl>(std::move(dsn), options)) {}
PostgresBackend::PostgresBackend(std::shared_ptr<ConnectionSource> pool, PostgresOptions options)
    : impl_(std::make_unique<Impl>(std::move(pool), options)) {}
PostgresBackend::PostgresBackend(PostgresBackend&&) noexcept = default;
PostgresBackend& PostgresBackend::operator=(PostgresBackend&&) noexcept = default;
PostgresBackend::~PostgresBackend() = default;

namespace {
tl::unexpected<Error> moved_from() { return fail(Errc::invalid_argument, "this PostgresBackend was moved from"); }

// A heartbeat or release that matched no row: the grant is gone.
tl::unexpected<Error> no_row_for(const HolderKey& key) {
  return fail(Errc::lock_not_held, lock_context(key.lock) + " has no row for instance '" +
                                       std::string(key.instance_id) + "' with fence " + std::to_string(key.fence));
}
}  // namespace

std::string PostgresBackend::redacted_dsn() const { return impl_ ? impl_->redacted : std::string(); }

std::string PostgresBackend::release_channel(LockRef lock) {
  return postgres_detail::release_channel(lock.table, lock.lock_name);
}

Result<void> PostgresBackend::connect() noexcept {
  if (!impl_) return moved_from();
  std::lock_guard lock(impl_->mutex);
  return impl_->run<void>("connect", Effect::read, [](pqxx::connection&, bool) -> Result<void> { return {}; });
}

// ---- the Backend contract ---------------------------------------------------

Result<void> PostgresBackend::create_schema(std::string_view table) noexcept {
  if (!impl_) return moved_from();
  if (auto valid = validate_table_name(table); !valid) return valid;
  std::lock_guard lock(impl_->mutex);
  const std::string what = "create_schema('" + std::string(table) + "')";
  return impl_->run<void>(what, Effect::idempotent_write, [&](pqxx::connection& c, bool) -> Result<void> {
    pqxx::work tx(c);
    tx.exec("SET LOCAL client_min_messages = warning");
    // Two processes creating the schema at once would race on the catalog.
    tx.exec("SELECT pg_advisory_xact_lock(hashtext('pgmutex.create_schema'))");
    tx.exec(create_schema_sql(table));
    const pqxx::result fence = tx.exec_params(
        "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'fence' AND NOT attisdropped",
        quote_table(table));
    // A table made by the seed's DDL: add the fence column (existing rows get fresh fences).
    if (fence.empty()) tx.exec(add_fence_sql(table));
    tx.commit();
    return {};
  });
}

Result<AcquireResult> PostgresBackend::try_acquire(const AcquireRequest& request) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<AcquireResult>(
      request.lock.table, "acquire " + lock_context(request.lock), Effect::write,
      [&](pqxx::connection& c, bool borrowed, const TableStatements& st) -> Result<AcquireResult> {
        const pqxx::result r = impl_->exec(c, borrowed, st.acquire, std::string(request.lock.lock_name),
                                           std::string(request.instance_id), seconds_param(request.stale_threshold));
        const pqxx::row row = r.at(0);
        AcquireResult out;
        const bool have_current = !row[2].is_null();
        if (have_current) {
          out.holder = row[2].as<std::string>();
          out.fence = row[3].as<Fence>();
          out.holder_age_s = row[4].as<double>();
        }
        if (!row[0].is_null()) {
          out = AcquireResult{};
          out.acquired = true;
          out.fence = row[0].as<Fence>();
        } else if (!row[1].is_null()) {
          out.acquired = true;
          out.reclaimed = true;
          out.fence = row[1].as<Fence>();
        } else if (!have_current) {
          // Lost a race with a concurrent insert: our snapshot predates the
          // winner's row, and ON CONFLICT DO NOTHING returns nothing. The
          // winner has committed by now, so a new statement can name it.
          const pqxx::result winner = impl_->exec(c, borrowed, st.inspect, std::string(request.lock.lock_name));
          if (!winner.empty()) {
            out.holder = winner[0][1].as<std::string>();
            out.fence = winner[0][2].as<Fence>();
            out.holder_age_s = winner[0][4].as<double>();
          }
        }
        return out;
      });
}

Result<void> PostgresBackend::heartbeat(const HolderKey& key) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<void>(
      key.lock.table, "heartbeat " + lock_context(key.lock), Effect::idempotent_write,
      [&](pqxx::connection& c, bool borrowed, const TableStatements& st) -> Result<void> {
        const pqxx::result r = impl_->exec(c, borrowed, st.heartbeat, std::string(key.lock.lock_name),
                                           std::string(key.instance_id), key.fence);
        if (r.affected_rows() == 0) return no_row_for(key);
        return {};
      });
}

Result<void> PostgresBackend::release(const HolderKey& key) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<void>(
      key.lock.table, "release " + lock_context(key.lock), Effect::write,
      [&](pqxx::connection& c, bool borrowed, const TableStatements& st) -> Result<void> {
        const pqxx::result r =
            impl_->exec(c, borrowed, st.release, std::string(key.lock.lock_name), std::string(key.instance_id),
                        key.fence, postgres_detail::release_channel(key.lock.table, key.lock.lock_name));
        if (r.empty()) return no_row_for(key);
        return {};
      });
}

Result<std::optional<LockRow>> PostgresBackend::inspect(LockRef lock_ref) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<std::optional<LockRow>>(
      lock_ref.table, "inspect " + lock_context(lock_ref), Effect::read,
      [&](pqxx::connection& c, bool borrowed, const TableStatements& st) -> Result<std::optional<LockRow>> {
        const pqxx::result r = impl_->exec(c, borrowed, st.inspect, std::string(lock_ref.lock_name));
        if (r.empty()) return std::optional<LockRow>{};
        return std::optional<LockRow>{row_from(r[0])};
      });
}

Result<std::vector<LockRow>> PostgresBackend::list(std::string_view table) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<std::vector<LockRow>>(
      table, "list locks in '" + std::string(table) + "'", Effect::read,
      [&](pqxx::connection& c, bool borrowed, const TableStatements& st) -> Result<std::vector<LockRow>> {
        const pqxx::result r = impl_->exec(c, borrowed, st.list);
        std::vector<LockRow> rows;
        rows.reserve(r.size());
        for (const pqxx::row& row : r) rows.push_back(row_from(row));
        return rows;
      });
}

Result<std::optional<LockRow>> PostgresBackend::force_release(LockRef lock_ref) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<std::optional<LockRow>>(
      lock_ref.table, "force-release " + lock_context(lock_ref), Effect::write,
      [&](pqxx::connection& c, bool borrowed, const TableStatements& st) -> Result<std::optional<LockRow>> {
        const pqxx::result r = impl_->exec(c, borrowed, st.force_release, std::string(lock_ref.lock_name),
                                           postgres_detail::release_channel(lock_ref.table, lock_ref.lock_name));
        if (r.empty()) return std::optional<LockRow>{};
        return std::optional<LockRow>{row_from(r[0])};
      });
}

// ---- optional operations ------------------------------------------------------

Result<bool> PostgresBackend::wait_for_release(LockRef lock_ref, std::chrono::nanoseconds timeout) noexcept {
  if (!impl_) return moved_from();
  std::lock_guard lock(impl_->mutex);
  if (auto valid = validate_table_name(lock_ref.table); !valid) return tl::unexpected(std::move(valid.error()));
  return impl_->run<bool>(
      "wait for release of " + lock_context(lock_ref), Effect::read,
      [&](pqxx::connection& c, bool borrowed) -> Result<bool> {
        const std::string channel = postgres_detail::release_channel(lock_ref.table, lock_ref.lock_name);
        // On our own connection the LISTEN stays, so a release between two
        // waits is not missed; a borrowed connection is left as it was found.
        std::unique_ptr<ReleaseListener> temporary;
        ReleaseListener* listener = nullptr;
        if (borrowed) {
          temporary = std::make_unique<ReleaseListener>(c, channel);
          listener = temporary.get();
        } else {
          auto found = impl_->listeners.find(channel);
          if (found == impl_->listeners.end()) {
            if (impl_->listeners.size() >= max_cached_listeners) impl_->listeners.clear();
            found = impl_->listeners.emplace(channel, std::make_unique<ReleaseListener>(c, channel)).first;
          }
          listener = found->second.get();
        }
        c.get_notifs();
        if (listener->take()) return true;
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (;;) {
          const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - std::chrono::steady_clock::now());
          if (left <= std::chrono::microseconds::zero()) return false;
          c.await_notification(static_cast<long>(left.count() / 1000000), static_cast<long>(left.count() % 1000000));
          if (listener->take()) return true;
        }
      });
}

Result<std::vector<bool>> PostgresBackend::heartbeat_many(std::span<const HolderKey> keys) noexcept {
  if (!impl_) return moved_from();
  std::vector<bool> held(keys.size(), false);
  if (keys.empty()) return held;
  try {
    std::lock_guard lock(impl_->mutex);
    // One statement per table (usually exactly one).
    std::set<std::string_view> tables;
    for (const HolderKey& key : keys) tables.insert(key.lock.table);
    for (std::string_view table : tables) {
      auto st = impl_->statements(table);
      if (!st) return tl::unexpected(std::move(st.error()));
      std::vector<std::string_view> names, instances;
      std::vector<std::size_t> index;
      std::string fences = "{";
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (keys[i].lock.table != table) continue;
        names.push_back(keys[i].lock.lock_name);
        instances.push_back(keys[i].instance_id);
        index.push_back(i);
        if (fences.size() > 1) fences.push_back(',');
        fences += std::to_string(keys[i].fence);
      }
      fences.push_back('}');
      auto batch = impl_->run<void>(
          "heartbeat " + std::to_string(index.size()) + " locks in '" + std::string(table) + "'",
          Effect::idempotent_write, [&](pqxx::connection& c, bool borrowed) -> Result<void> {
            const pqxx::result r =
                impl_->exec(c, borrowed, (*st)->heartbeat_many, text_array(names), text_array(instances), fences);
            std::set<std::tuple<std::string, std::string, Fence>> beaten;
            for (const pqxx::row& row : r)
              beaten.emplace(row[0].as<std::string>(), row[1].as<std::string>(), row[2].as<Fence>());
            for (std::size_t k = 0; k < index.size(); ++k)
              held[index[k]] = beaten.contains({std::string(names[k]), std::string(instances[k]), keys[index[k]].fence});
            return {};
          });
      if (!batch) return tl::unexpected(std::move(batch.error()));
    }
    return held;
  } catch (...) {
    return tl::unexpected(map_current_exception("heartbeat_many", Effect::idempotent_write, impl_->secrets).error);
  }
}

static_assert(Backend<PostgresBackend>);
static_assert(BackendWaitsForRelease<PostgresBackend>);
static_assert(BackendBatchesHeartbeats<PostgresBackend>);

}  // namespace pgmutex
