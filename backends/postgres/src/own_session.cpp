// The backend's own connection as a Session (own_session.hpp): reconnects
// with backoff, the pooler probe, prepared statements, LISTEN and NOTIFY.
#include "own_session.hpp"

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <thread>

#include <libpq-fe.h>

#include "conninfo_rules.hpp"
#include "dsn.hpp"
#include "error_mapping.hpp"
#include "host_attempts.hpp"

namespace pgmutex::postgres_detail {
namespace {

constexpr std::size_t max_listened_channels = 64;
constexpr std::string_view duplicate_prepared_statement = "42P05";

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  return text;
}

// A failure before the statement itself was sent (a SET, a PREPARE): whatever
// the operation, it did not run.
StatementFailure not_sent(StatementFailure failure) {
  failure.sent = false;
  return failure;
}

// The highest $N in `sql`: how many parameters a statement takes.
int highest_parameter(std::string_view sql) {
  int highest = 0;
  for (std::size_t at = sql.find('$'); at != std::string_view::npos; at = sql.find('$', at + 1)) {
    int n = 0;
    for (std::size_t i = at + 1; i < sql.size() && sql[i] >= '0' && sql[i] <= '9'; ++i) n = n * 10 + (sql[i] - '0');
    highest = std::max(highest, n);
  }
  return highest;
}

}  // namespace

OwnSession::OwnSession(std::string conninfo, std::string redacted, std::vector<std::string> secrets,
                       PostgresOptions options)
    : conninfo_(std::move(conninfo)), redacted_(std::move(redacted)), secrets_(std::move(secrets)), options_(options) {}

OwnSession::~OwnSession() {
  if (options_.hand_over_at_close && connection_) (void)connection_->close_handing_over(options_.hand_over_at_close);
}

void OwnSession::drop() noexcept {
  connection_.reset();
  prepared_.clear();
  planned_.clear();
  generic_plans_ = false;
  oids_.clear();
  listening_.clear();
  statement_timeout_ms_ = -1;
  behind_pooler_ = false;
}

bool OwnSession::unnamed() const {
  return options_.statement_mode == StatementMode::unnamed ||
         (options_.statement_mode == StatementMode::automatic && behind_pooler_);
}

std::string OwnSession::user() const { return connection_ ? connection_->user() : std::string(); }

Outcome<void> OwnSession::probe_pooler(Deadline deadline) {
  ++statements_;
  auto rows = connection_->exec_simple("SELECT pg_backend_pid()", deadline);
  if (!rows) return tl::unexpected(std::move(rows.error()));
  const int pid = std::atoi(rows->text(0, 0).c_str());
  behind_pooler_ = pid != connection_->reported_backend_pid();
  // Our own releases' NOTIFYs come from this pid (behind a pooler in session
  // pooling too, where the start-up reported the pooler's key).
  connection_->set_backend_pid(pid);
  return {};
}

Result<void> OwnSession::ensure_connected(Deadline deadline) {
  if (connection_ && connection_->usable()) return {};
  drop();
  // A DSN libpq cannot parse is the caller's mistake, not an outage: say so
  // at once instead of retrying. libpq's message names the bad part.
  // Its message may quote the string it read: the one the user wrote (masked),
  // never ours with the timeouts appended.
  const auto parse_failure = [](const std::string& conninfo) -> std::optional<std::string> {
    char* parse_error = nullptr;
    if (PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &parse_error)) {
      PQconninfoFree(parsed);
      return std::nullopt;
    }
    std::string cause = parse_error != nullptr ? trimmed(parse_error) : "out of memory";
    if (parse_error != nullptr) PQfreemem(parse_error);
    return cause;
  };
  if (auto cause = parse_failure(conninfo_)) {
    if (auto as_written = parse_failure(redacted_)) cause = std::move(as_written);
    return fail(Errc::invalid_argument, "invalid connection string '" + redacted_ + "': " + scrub(*cause, secrets_));
  }
  if (auto refused = conninfo_value_error(conninfo_))
    return fail(Errc::invalid_argument, "invalid connection string '" + redacted_ + "': " + scrub(*refused, secrets_));
  // Each host of a multi-host string gets options_.connect_timeout of its own
  // (the callers set it from the DSN's connect_timeout, libpq's per-host
  // meaning), or an even share of the time left if that is shorter: a first
  // host that never answers cannot starve the second (host_attempts.hpp).
  const std::vector<HostAttempt> hosts = host_attempts(conninfo_);
  const auto per_host = options_.connect_timeout;
  auto delay = options_.reconnect_backoff;
  const int attempts = std::max(1, options_.reconnect_attempts);
  std::string last;
  int made = 0;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    if (attempt > 0) {
      if (std::chrono::steady_clock::now() + delay >= deadline) break;  // no time left for another try
      std::this_thread::sleep_for(delay);
      delay *= 2;
    }
    ++made;
    const Deadline connect_by =
        per_host > std::chrono::nanoseconds::zero()
            ? std::min(deadline, std::chrono::steady_clock::now() + per_host * static_cast<long>(hosts.size()))
            : deadline;
    auto opened = unidentified_ ? Outcome<PqConnection>(*std::exchange(unidentified_, std::nullopt))
                                : open_server(hosts, per_host, deadline);
    if (opened && std::chrono::steady_clock::now() >= deadline) {
      // Connected just too late for this operation: keep the connection
      // for the next one rather than close a server process that has just
      // started. (It is identified then: a query past the deadline would
      // leave it mid-statement.)
      unidentified_.emplace(std::move(*opened));
      last = "connected as the operation's deadline passed; the next operation uses the connection";
      break;
    }
    if (opened) {
      // Which server this is: a failover to a standby (a new timeline) or
      // another cluster shows as a new history.
      ++statements_;  // the identity query
      if (auto identified = history_.on_connect(*opened, deadline); !identified) {
        last = identified.error().message;
        continue;
      }
      connection_.emplace(std::move(*opened));
      if (options_.statement_mode != StatementMode::unnamed) {
        if (auto probed = probe_pooler(connect_by); !probed) {
          connection_.reset();
          behind_pooler_ = false;
          if (!connection_gone(probed.error()))
            return tl::unexpected(to_error(probed.error(), "connect to '" + redacted_ + "'", Effect::read, secrets_));
          last = probed.error().message;
          continue;
        }
      }
      if (hear_own_) connection_->set_backend_pid(-1);  // no server process has that pid
      ++connects_;
      return {};
    }
    // The server answered and refused us (bad password, no such database or
    // role): trying again gives the same answer. Only "not now" is retried.
    if (opened.error().kind == StatementFailure::Kind::server && !connection_gone(opened.error()))
      return tl::unexpected(to_error(opened.error(), "connect to '" + redacted_ + "'", Effect::read, secrets_));
    last = opened.error().message;
  }
  return fail(Errc::backend_unavailable, "cannot connect to '" + redacted_ + "': " + scrub(last, secrets_) +
                                             " (after " + std::to_string(made) +
                                             (made == 1 ? " attempt)" : " attempts)"));
}

Outcome<PqConnection> OwnSession::open_server(const std::vector<HostAttempt>& hosts,
                                              std::chrono::nanoseconds per_host, Deadline deadline) {
  // Several hosts: each attempt within its share of the operation's
  // deadline, so a host that never answers cannot starve the next one.
  if (hosts.size() != 1 || per_host <= std::chrono::nanoseconds::zero()) return open_first(hosts, per_host, deadline);
  const auto now = std::chrono::steady_clock::now();
  if (connecting_ && now >= connecting_until_) connecting_.reset();  // its own budget ran out: start afresh
  if (!connecting_) {
    auto started = PqConnecting::start(hosts.front().conninfo);
    if (!started) return tl::unexpected(std::move(started.error()));
    connecting_.emplace(std::move(*started));
    connecting_until_ = now + per_host;
  }
  auto opened = connecting_->poll_until(std::min(deadline, connecting_until_));
  if (!opened && connecting_->pending() && std::chrono::steady_clock::now() < connecting_until_)
    return tl::unexpected(StatementFailure{StatementFailure::Kind::timeout, {},
                                           "timed out while connecting (the connect goes on: the next operation "
                                           "takes it up, within connect_timeout)",
                                           false});
  connecting_.reset();
  return opened;
}

Outcome<void> OwnSession::use_statement_timeout(const Bound& bound) {
  const long long ms = bound.statement_timeout.count();
  if (ms == statement_timeout_ms_) return {};
  ++statements_;
  auto set = connection().exec_params("SELECT set_config('statement_timeout', $1, false)", {std::to_string(ms)},
                                      bound.deadline);
  if (!set) return tl::unexpected(not_sent(std::move(set.error())));
  statement_timeout_ms_ = ms;
  return {};
}

Outcome<Rows> OwnSession::run(const Statement& statement, const std::vector<std::string>& params, const Bound& bound) {
  // Behind a transaction pooler the next statement may meet another server
  // process: nothing is prepared, nothing is set for the session. The
  // statement_timeout is set for the statement's own transaction, in the same
  // round trip, before the statement starts (it is read at its start).
  ++statements_;
  if (unnamed())
    return connection().exec_params_after("SELECT set_config('statement_timeout', $1, true)",
                                          {std::to_string(bound.statement_timeout.count())}, statement.sql, params,
                                          bound.deadline);
  if (auto set = use_statement_timeout(bound); !set) return tl::unexpected(std::move(set.error()));
  if (auto prepared = prepare(statement, bound); !prepared) return tl::unexpected(std::move(prepared.error()));
  return connection().exec_prepared(statement.name, params, bound.deadline);
}

Outcome<void> OwnSession::prepare(const Statement& statement, const Bound& bound) {
  if (unnamed() || prepared_.contains(statement.name)) return {};
  ++statements_;
  auto prepared = connection().prepare(statement.name, statement.sql, bound.deadline);
  // A Parse the server carried out can still be answered with an error: the
  // statement_timeout fired while the server waited for the Sync behind it
  // (a slow link, a loaded server). The statement then exists under our name,
  // and every later Parse of it is refused with 42P05. A name carries a hash
  // of its text (sql.hpp), so the one there is this one.
  if (!prepared && !(prepared.error().kind == StatementFailure::Kind::server &&
                     prepared.error().sqlstate == duplicate_prepared_statement))
    return tl::unexpected(not_sent(std::move(prepared.error())));
  prepared_.insert(statement.name);
  return {};
}

Outcome<void> OwnSession::plan_ahead(std::initializer_list<const Statement*> statements, const Bound& bound) {
  if (unnamed()) return {};
  std::string sql;
  std::vector<const std::string*> planning;
  for (const Statement* statement : statements) {
    if (!prepared_.contains(statement->name) || planned_.contains(statement->name)) continue;
    planning.push_back(&statement->name);
    sql += (sql.empty() ? "" : "; ") + std::string("EXPLAIN (COSTS OFF) EXECUTE ") + statement->name + "(";
    for (int i = 0; i < highest_parameter(statement->sql); ++i) sql += i == 0 ? "NULL" : ", NULL";
    sql += ")";
  }
  if (planning.empty()) return {};
  // A session setting, read at each statement's Bind: set before the
  // EXPLAINs, it has them build the generic plans and keep them.
  const bool set_generic = options_.generic_plans_for_handoff && !generic_plans_;
  if (set_generic) sql = "SET plan_cache_mode = force_generic_plan; " + sql;
  auto planned = run_text(sql, {}, bound);
  if (!planned) return tl::unexpected(std::move(planned.error()));
  for (const std::string* name : planning) planned_.insert(*name);
  generic_plans_ = generic_plans_ || set_generic;
  return {};
}

Outcome<Rows> OwnSession::run_text(const std::string& sql, const std::vector<std::string>& params, const Bound& bound) {
  if (!unnamed()) {
    if (auto set = use_statement_timeout(bound); !set) return tl::unexpected(std::move(set.error()));
  }
  ++statements_;
  if (params.empty()) return connection().exec_simple(sql, bound.deadline);
  return connection().exec_params(sql, params, bound.deadline);
}

Outcome<std::string> OwnSession::table_oid(std::string_view table, const Bound& bound) {
  // Resolved once per connection: after a reconnect (say, the table was
  // dropped and made again meanwhile) it is asked again.
  if (const auto found = oids_.find(table); found != oids_.end()) return found->second;
  auto rows = run_text(std::string(table_oid_sql), {quote_table(table)}, bound);
  if (!rows) return tl::unexpected(std::move(rows.error()));
  const std::string oid = rows->text(0, 0);
  oids_.emplace(std::string(table), oid);
  return oid;
}

Outcome<void> OwnSession::listen(const std::string& channel, const Bound& bound) {
  return listen(std::vector<std::string>{channel}, bound);
}

Outcome<void> OwnSession::listen(const std::vector<std::string>& channels, const Bound& bound) {
  // The channels not listened yet, in one round trip (a simple query may hold several statements).
  std::string sql;
  for (const std::string& channel : channels)
    if (!listening_.contains(channel)) sql += "LISTEN \"" + channel + "\"; ";  // identifiers release_channel() made
  if (sql.empty()) return {};
  if (auto listened = run_text(sql, {}, bound); !listened) return tl::unexpected(std::move(listened.error()));
  listening_.insert(channels.begin(), channels.end());
  return {};
}

bool OwnSession::consume_input() {
  if (!connection_) return false;
  if (connection_->consume_input()) return true;
  drop();
  return false;
}

std::vector<Notification> OwnSession::take_notifications() {
  return connection_ ? connection_->take_notifications() : std::vector<Notification>{};
}

std::vector<std::string> OwnSession::take_payloads(const std::string& channel) {
  return connection_ ? connection_->take_payloads(channel) : std::vector<std::string>{};
}

Outcome<PqConnection::Woke> OwnSession::await_input(Deadline deadline, int wake_fd) {
  if (!connection_) return tl::unexpected(StatementFailure{StatementFailure::Kind::connection_lost, {}, "not connected", false});
  auto woke = connection_->await_input(deadline, wake_fd);
  if (!woke) drop();
  return woke;
}

int OwnSession::reported_backend_pid() const {
  return connection_ && !unnamed() ? connection_->reported_backend_pid() : 0;
}

Outcome<bool> OwnSession::wait_for_notification(const std::string& channel, const Bound& bound, Deadline wait_until) {
  // The LISTEN stays on our connection, so a release between two waits is not missed.
  if (!listening_.contains(channel)) {
    if (listening_.size() >= max_listened_channels) {
      if (auto cleared = run_text("UNLISTEN *", {}, bound); !cleared) return tl::unexpected(std::move(cleared.error()));
      listening_.clear();
    }
    // The channel is an identifier that release_channel() made: safe to quote and send.
    if (auto listened = run_text("LISTEN \"" + channel + "\"", {}, bound); !listened)
      return tl::unexpected(std::move(listened.error()));
    listening_.insert(channel);
  }
  return connection().wait_for_notification(channel, wait_until);
}

}  // namespace pgmutex::postgres_detail
