// The Backend contract's operations (create_schema, try_acquire, heartbeat,
// release, inspect, list, force_release), each written once against a
// Session, whichever connection runs it (backend_connection.cpp).
#include <unistd.h>

#include "backend_impl.hpp"
#include "queue_rules.hpp"
#include "statement_values.hpp"

namespace pgmutex {

using namespace postgres_detail;

namespace {

// A raced losing try (the row it saw was released, or taken over by another
// reclaimer) is tried again this many times, so that it names the current
// holder, never one that is gone.
constexpr int acquire_tries = 3;

// A heartbeat or release that matched no row: the grant is gone.
tl::unexpected<Error> no_row_for(const HolderKey& key) {
  return fail(Errc::lock_not_held, lock_context(key.lock) + " has no row for instance '" +
                                       std::string(key.instance_id) + "' with fence " + std::to_string(key.fence) +
                                       " and this grant's token");
}

// create_schema was refused (42501): which privilege is missing, and the
// GRANT that fixes it. Asks the server which schema the table goes to and
// whether the role may create in it; empty if that cannot be told.
std::string missing_create_privilege(Session& session, std::string_view table, const Bound& bound) {
  const std::string given = parse_table_name(table).value().schema;  // validated: parses
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

namespace {

// The lean confirm of an offer this backend's wait heard (the whole queued
// try's first branch, queue_sql.cpp): acquired, or not (the offer is not
// ours any more, or none was heard) and nothing was written.
template <class Impl>
Outcome<AcquireResult> confirm_offer(Impl& impl, Session& session, const Bound& bound, const TableStatements& st,
                                     const AcquireRequest& request, GrantAnnouncement* announce) {
  const auto here = impl.queued_here.find(request.queue_ticket);
  if (here == impl.queued_here.end() || !here->second.offered) return AcquireResult{};
  std::vector<std::string> params{std::string(request.lock.lock_name), std::string(request.instance_id),
                                  token_param(request.token), std::to_string(request.queue_ticket),
                                  bound.lock_timeout_param(),
                                  request.holder_details.host.empty() ? impl.host
                                                                      : std::string(request.holder_details.host)};
  if (announce) {
    params.push_back(lock_hash(request.lock.lock_name));
    params.emplace_back(announce->value);
  }
  if (const auto& window = impl.options.unflushed_confirm_window; window && !impl.core) {
    params.push_back(seconds_param(std::max<std::chrono::nanoseconds>(*window, std::chrono::milliseconds(1))));
  } else {
    // None: the confirm waits for its flush. A Session's too: its first
    // heartbeat would go out in a batch of its own, with another statement
    // timeout set before it and again before the next statement (measured:
    // three statements per handoff, not two, on top of the batch).
    params.emplace_back("-1");
  }
  auto rows = session.run(announce ? st.election_confirm_offer : st.confirm_offer, params, bound);
  if (!rows) return tl::unexpected(std::move(rows.error()));
  AcquireResult answer = read_confirmed_offer(*rows);
  if (!answer.acquired) {
    here->second.offered = false;  // the queued try finds out what became of it
    return answer;
  }
  // An unflushed confirm is no durable commit: the holder's first heartbeat is.
  if (impl.mark && answer.provisional_for == std::chrono::nanoseconds::zero()) impl.durable_done(session);
  if (announce) announce->announced = rows->text(0, 3) == "t";
  impl.queued_here.erase(here);
  return answer;
}

// This waiter's queued try offered the lock to the head and named it the
// runner-up, or found an offer standing with it first behind: it watches
// the head's handoff deadline (`head_handoff_ms`: the whole deadline, or
// what is left of it), as a release's NOTIFY naming it would have had it
// (queue_waits.cpp). Its own NOTIFY does not reach it: a connection ignores
// its own (pq_connection.cpp). A Session's waiter reads the probe from here
// (SharedAccess::take_probe) into its place (queue_book.cpp): its enqueue
// ran on the I/O thread's backend, so the entry may be new here.
template <class Impl>
void watch_the_head(Impl& impl, std::int64_t ticket, const std::string& head_handoff_ms) {
  auto& here = impl.queued_entry(ticket);
  std::optional<std::chrono::milliseconds> head_handoff;
  if (!head_handoff_ms.empty()) head_handoff = std::chrono::milliseconds(std::stoll(head_handoff_ms));
  here.near = true;
  here.probe_at = probe_time(std::chrono::steady_clock::now(), head_handoff, here.handoff);
}

// A try (plain or queued), or a campaign's (`announce` set: the election's
// variant of the same statement, election_sql.cpp, which announces a grant
// it makes for itself in the same transaction; announce->announced says
// whether the answer shows it announced).
template <class Impl>  // PostgresBackend::Impl, deduced (it is private)
Result<AcquireResult> acquire_try(Impl& impl, const AcquireRequest& request, GrantAnnouncement* announce) {
  return impl.template on_table<AcquireResult>(
      request.lock.table, "acquire " + lock_context(request.lock), Effect::write, request.timeout,
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<AcquireResult> {
        if (announce) impl.campaigns = true;  // its waits prepare the election's statements (queue_waits.cpp)
        const HolderDetails& given = request.holder_details;
        std::vector<std::string> params{
            std::string(request.lock.lock_name), std::string(request.instance_id),
            seconds_param(request.stale_threshold), token_param(request.token), bound.lock_timeout_param(),
            given.host.empty() ? impl.host : std::string(given.host),
            std::to_string(given.pid != 0 ? given.pid : static_cast<std::int64_t>(::getpid())),
            given.command.empty() ? impl.options.holder_command : std::string(given.command),
            impl.grace_param()};
        if (request.queue_ticket != 0) [[unlikely]] {
          // A queued try (queue_sql.cpp): one statement, never retried here;
          // after an offer named us, the lean confirm first.
          if (auto confirmed = confirm_offer(impl, session, bound, st, request, announce); !confirmed)
            return tl::unexpected(std::move(confirmed.error()));
          else if (confirmed->acquired)
            return *confirmed;
          std::vector<std::string> queued = params;
          queued.push_back(std::to_string(request.queue_ticket));
          queued.push_back(std::to_string(session.reported_backend_pid()));
          queued.push_back(lock_hash(request.lock.lock_name));
          if (announce) queued.emplace_back(announce->value);
          auto rows = session.run(announce ? st.election_acquire_queued : st.acquire_queued, queued, bound);
          if (!rows) return tl::unexpected(std::move(rows.error()));
          AcquireResult answer = read_queued_acquire(*rows);
          if (answer.acquired && impl.mark) impl.durable_done(session);
          if (answer.acquired || answer.queue_place_lost) impl.queued_here.erase(request.queue_ticket);
          else if (!rows->is_null(0, 13) && std::stoll(rows->text(0, 13)) == request.queue_ticket)
            watch_the_head(impl, request.queue_ticket, rows->is_null(0, 14) ? "" : rows->text(0, 14));
          if (announce) announce->announced = answer.acquired && rows->text(0, 15) == "t";
          return answer;
        }
        if (announce) {
          params.emplace_back(announce->value);
          params.push_back(lock_hash(request.lock.lock_name));
        }
        AcquireResult out;
        for (int attempt = 0; attempt < acquire_tries; ++attempt) {
          // Each try that lost changed nothing, so trying again is safe.
          auto rows = session.run(announce ? st.election_acquire : st.acquire, params, bound);
          if (!rows) return tl::unexpected(std::move(rows.error()));
          bool raced = false;
          out = read_acquire(*rows, raced);
          if (out.acquired && impl.mark) impl.durable_done(session);  // an acquire commits synchronously
          if (announce) announce->announced = out.acquired && rows->text(0, 9) == "t";
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

// A release (the holder's key), or a resign's (`vacate`: the statement also
// vacates the grant's term).
template <class Impl>
Result<void> release_with(Impl& impl, const HolderKey& key, bool vacate) {
  auto removed = impl.template on_table<bool>(
      key.lock.table, (vacate ? "resign " : "release ") + lock_context(key.lock), Effect::write, key.timeout,
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<bool> {
        auto rows = session.run(vacate ? st.election_release : st.release,
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

}  // namespace

Result<AcquireResult> PostgresBackend::try_acquire(const AcquireRequest& request) noexcept {
  if (!impl_) return moved_from();
  return acquire_try(*impl_, request, nullptr);
}

Result<AcquireResult> PostgresBackend::try_acquire(const AcquireRequest& request,
                                                   GrantAnnouncement& announcement) noexcept {
  announcement.announced = false;
  if (!impl_) return moved_from();
  if (auto valid = validate_election_value(request.lock.lock_name, announcement.value); !valid)
    return tl::unexpected(valid.error());
  return acquire_try(*impl_, request, &announcement);
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
  return release_with(*impl_, key, false);
}

Result<void> PostgresBackend::release_vacating(const HolderKey& key) noexcept {
  if (!impl_) return moved_from();
  return release_with(*impl_, key, true);
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

Result<std::vector<QueuedWaiterRow>> PostgresBackend::list_queue(std::string_view table) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<std::vector<QueuedWaiterRow>>(
      table, "list the queue of '" + std::string(table) + "'", Effect::read, {},
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<std::vector<QueuedWaiterRow>> {
        auto rows = session.run(st.list_queue, {}, bound);
        if (!rows) return tl::unexpected(std::move(rows.error()));
        std::vector<QueuedWaiterRow> out;
        out.reserve(rows->size());
        for (std::size_t r = 0; r < rows->size(); ++r) out.push_back(waiter_from(*rows, r));
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

}  // namespace pgmutex
