// How a PostgresBackend reaches the server: its own connection (opened and
// reopened on demand, its server history followed), a connection borrowed
// from the user's pool for each operation, or a shared session's, run on the
// session's thread; and what each try leaves behind: the server session and
// history it ran on, the GRANTs a refusal needs.
#include <unistd.h>

#include <algorithm>

#include "backend_impl.hpp"
#include "pgmutex/table_name.hpp"
#include "dsn.hpp"
#include "host_attempts.hpp"
#include "pooled_session.hpp"
#include "statement_values.hpp"

namespace pgmutex {

using namespace postgres_detail;

namespace postgres_detail {

// A refusal (42501) of a statement on `table`: the GRANTs that fix it, for the
// role the connection logged in as. A read needs SELECT alone (a monitoring
// role); holding locks needs the rest.
void name_the_grants(StatementFailure& failure, std::string_view table, const std::string& role, Effect effect) {
  if (failure.kind != StatementFailure::Kind::server || failure.sqlstate != "42501" || !failure.hint.empty() ||
      table.empty())
    return;
  const std::string r = role.empty() ? "ROLE" : sql_identifier(role);
  // A refusal on the elections table (named in the server's message): its own GRANT.
  const std::string elections = sql_election_table(table);
  const auto parts = parse_table_name(table);
  if (parts && failure.message.find("permission denied for table " + derived_identifier("", parts->name, "_election")) !=
                   std::string::npos) {
    failure.hint = "role " + r + " needs SELECT on the elections table " + elections + " to read leaders, and "
                   "INSERT, UPDATE too to campaign; as its owner, run: GRANT SELECT, INSERT, UPDATE ON " + elections +
                   " TO " + r;
    return;
  }
  if (effect == Effect::read) {
    failure.hint = "role " + r + " needs SELECT on the lock table " + sql_table(table) + " and its queue " +
                   sql_queue_table(table) + " to read them; as their owner, run: GRANT SELECT ON " +
                   sql_table(table) + ", " + sql_queue_table(table) + " TO " + r +
                   " (holding locks needs INSERT, UPDATE, DELETE too, and USAGE on the sequence " +
                   sql_fence_sequence(table) + ")";
    return;
  }
  failure.hint = "role " + r + " needs SELECT, INSERT, UPDATE, DELETE on the lock table " + sql_table(table) +
                 " and its queue " + sql_queue_table(table) + ", and USAGE on its sequence " +
                 sql_fence_sequence(table) + "; as their owner, run: GRANT SELECT, INSERT, UPDATE, DELETE ON " +
                 sql_table(table) + ", " + sql_queue_table(table) + " TO " + r + "; GRANT USAGE ON SEQUENCE " +
                 sql_fence_sequence(table) + " TO " + r;
}

// A write refused as read-only (25006): a standby, or a primary whose role
// or database makes every transaction read-only. Asked of the server itself.
void name_the_read_only_cause(StatementFailure& failure, Session& session, const Bound& bound) {
  if (failure.kind != StatementFailure::Kind::server || failure.sqlstate != "25006" || !failure.hint.empty()) return;
  auto rows = session.run_text("SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only')", {}, bound);
  // No answer: the server went away while it refused (a primary shutting down
  // to be demoted): transient, as a standby is.
  if (!rows || rows->empty()) {
    failure.on_standby = true;
    return;
  }
  if (rows->text(0, 0) == "t") {
    failure.on_standby = true;
    failure.hint = "the server is a read-only standby: connect to the primary, e.g. add target_session_attrs=read-write "
                   "to the DSN";
    return;
  }
  if (rows->text(0, 1) == "on") {
    failure.hint = "the server is a primary, but default_transaction_read_only is on for role " +
                   sql_identifier(session.user()) + " or this database: as an administrator, run ALTER ROLE " +
                   sql_identifier(session.user()) + " SET default_transaction_read_only = off (or ALTER DATABASE)";
    return;
  }
  // A primary now, and nothing makes it read-only: the refusal came from a
  // recovery that has just ended (a promotion under way when the statement
  // ran). Transient: the next try succeeds.
  failure.on_standby = true;
  failure.hint = "the server was a standby being promoted: try again";
}

std::string lock_context(LockRef lock) { return "lock '" + std::string(lock.lock_name) + "'"; }

tl::unexpected<Error> moved_from() { return fail(Errc::invalid_argument, "this PostgresBackend was moved from"); }

std::string this_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return {};
  return name;
}

}  // namespace postgres_detail

PostgresBackend::Impl::Impl(const std::string& dsn, PostgresOptions opts)
    : dsn(dsn), redacted(redact_dsn(dsn)), secrets(secrets_of(dsn)), options(opts) {
  PostgresOptions own_options = opts;
  own_options.connect_timeout = connect_timeout_per_host(dsn, opts.connect_timeout);
  own.emplace(with_network_timeout(with_connect_timeout(dsn, opts.connect_timeout), opts.network_timeout),
              redacted, secrets, own_options);
}

PostgresBackend::Impl::Impl(std::shared_ptr<ConnectionSource> source, PostgresOptions opts)
    : redacted("(connection pool)"), options(opts), pool(std::move(source)) {}

PostgresBackend::Impl::Impl(std::shared_ptr<SharedConnection> session_core, std::shared_ptr<DurableMark> durable_mark)
    : redacted(session_core->redacted()),
      secrets(session_core->secrets()),
      options(session_core->postgres_options()),
      core(std::move(session_core)),
      mark(std::move(durable_mark)) {}

bool PostgresBackend::Impl::unnamed_mode() const noexcept {
  switch (options.statement_mode) {
    case StatementMode::unnamed: return true;
    case StatementMode::prepared: return false;
    case StatementMode::automatic: return !pool && unnamed_in_use.load();  // own or shared
  }
  return false;
}

const TableStatements& PostgresBackend::Impl::statements(std::string_view table, bool unnamed) {
  const bool async = options.heartbeat_synchronous_commit_off && !unnamed;
  const std::string key = std::string(table) + (async ? "/async" : "/sync");
  if (const auto found = tables.find(key); found != tables.end()) return found->second;
  return tables.emplace(key, make_statements(table, async)).first->second;
}

std::string PostgresBackend::Impl::grace_param() const {
  if (!options.failover_grace) return "-1";
  return seconds_param(std::max(*options.failover_grace, std::chrono::nanoseconds::zero()));
}

std::chrono::nanoseconds PostgresBackend::Impl::bound_of(std::chrono::nanoseconds timeout) const {
  return timeout > std::chrono::nanoseconds::zero() ? timeout : options.default_timeout;
}

Result<void> PostgresBackend::Impl::try_once(std::string_view what, const Bound& bound, const Attempt& attempt) {
  if (pool) {
    auto session = PooledSession::borrow(*pool, secrets, options.statement_mode == StatementMode::unnamed);
    if (!session) return tl::unexpected(std::move(session.error()));
    (void)attempt(**session, bound);  // its failure stays in the caller's outcome
    last_session = (*session)->server_pid() << 1 | 1;  // odd: a pid, never a count
    return {};
  }
  if (core) {
    // The caller waits while the attempt runs on the session's thread, so
    // its references stay good; an attempt still queued at the deadline is
    // taken out and never runs.
    std::optional<Error> refused;
    const bool ran = core->call(
        [&](OwnSession& shared) {
          if (auto r = try_own(shared, bound, attempt); !r) refused = std::move(r.error());
        },
        bound.deadline);
    if (!ran)
      return fail(Errc::backend_unavailable,
                  std::string(what) + ": the session's connection was busy until the deadline (or the session stopped)");
    if (refused) return tl::unexpected(std::move(*refused));
    return {};
  }
  return try_own(*own, bound, attempt);
}

Result<void> PostgresBackend::Impl::try_own(OwnSession& session, const Bound& bound, const Attempt& attempt) {
  if (auto connected = session.ensure_connected(bound.deadline); !connected)
    return tl::unexpected(std::move(connected.error()));
  unnamed_in_use = session.unnamed();
  StatementFailure* failure = attempt(session, bound);
  last_session = session.connects() << 1;
  last_history = session.history().history();
  if (failure != nullptr && connection_gone(*failure)) session.drop();
  return {};
}

bool PostgresBackend::Impl::durable_due(Session& session) {
  auto* own_session = dynamic_cast<OwnSession*>(&session);
  if (own_session == nullptr) return false;
  if (mark) return mark->due(own_session->history().history());
  return own_session->history().durable_heartbeat_due();
}

void PostgresBackend::Impl::durable_done(Session& session) {
  auto* own_session = dynamic_cast<OwnSession*>(&session);
  if (own_session == nullptr) return;
  if (mark) mark->history = own_session->history().history();
  else own_session->history().durable_heartbeat_done();
}

}  // namespace pgmutex
