// PostgresBackend's state, and the one way each of its operations runs:
// serialized with the backend's others, bounded by a deadline, tried once
// more when that is safe. The templates here are thin; which connection runs
// the statements (the backend's own, one borrowed from a pool, or a shared
// session's) is backend_connection.cpp's business. Private to the backend.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "error_mapping.hpp"
#include "own_session.hpp"
#include "pgmutex/options.hpp"
#include "pgmutex/postgres_backend.hpp"
#include "release_poll.hpp"
#include "session.hpp"
#include "shared_connection.hpp"
#include "sql.hpp"

namespace pgmutex {

namespace postgres_detail {

// "lock '<name>'", for messages.
std::string lock_context(LockRef lock);
tl::unexpected<Error> moved_from();
// Stored with each grant, unless the request names one.
std::string this_host();

// What a failed statement's hint should say (backend_connection.cpp): the
// GRANTs a refusal needs, and why a write was refused as read-only.
void name_the_grants(StatementFailure& failure, std::string_view table, const std::string& role, Effect effect);
void name_the_read_only_cause(StatementFailure& failure, Session& session, const Bound& bound);

// One try of an operation's statements on `session`: the failure, if it
// failed (it stays in the caller's outcome), else nullptr.
using Attempt = std::function<StatementFailure*(Session& session, const Bound& bound)>;

}  // namespace postgres_detail

struct PostgresBackend::Impl {
  using Bound = postgres_detail::Bound;
  using Effect = postgres_detail::Effect;
  using Session = postgres_detail::Session;
  using TableStatements = postgres_detail::TableStatements;
  template <class T>
  using Outcome = postgres_detail::Outcome<T>;

  // Owns one connection, opened on demand from `dsn`.
  Impl(const std::string& dsn, PostgresOptions opts);
  // Borrows one from `source` per operation.
  Impl(std::shared_ptr<ConnectionSource> source, PostgresOptions opts);
  // Shared session: each operation's body runs on the session's I/O thread,
  // against its one connection (pgmutex::Session).
  Impl(std::shared_ptr<postgres_detail::SharedConnection> session_core,
       std::shared_ptr<postgres_detail::DurableMark> durable_mark);

  std::string dsn;  // as given, for share() (own connection only; a pool's and a session's stay empty)
  std::string redacted;
  std::vector<std::string> secrets;
  PostgresOptions options;
  std::string host = postgres_detail::this_host();  // stored with each grant, unless the request names one
  std::shared_ptr<ConnectionSource> pool;  // set: borrow per operation; else `own`
  std::optional<postgres_detail::OwnSession> own;
  std::shared_ptr<postgres_detail::SharedConnection> core;  // set: a shared session's (neither `pool` nor `own`)
  std::shared_ptr<postgres_detail::DurableMark> mark;  // with `core`: this backend's last durable write

  std::mutex mutex;  // one operation at a time: a connection never serves two threads at once
  std::uint64_t last_session = 0;  // the server session the last operation ran on (see session())
  std::uint64_t last_history = 0;  // the server history the last operation ran on (see history())
  HeartbeatDurability last_durability{};  // of the last heartbeat (see last_heartbeat_durability())
  // Keyed by table and commit mode: a connection behind a pooler (unnamed
  // statements) commits heartbeats synchronously, another may not.
  std::map<std::string, TableStatements, std::less<>> tables;
  // Whether the last connection used unnamed statements (read without the mutex).
  std::atomic<bool> unnamed_in_use{false};
  // Waits for release without LISTEN, by lock.
  postgres_detail::ReleasePolls polls;
  // What this backend's queued waiters know between statements, by ticket
  // (queue_waits.cpp): whether a payload may concern them soon.
  struct QueuedHere {
    bool pid_bound = false;  // its liveness is its connection's backend (else a lease the queued tries refresh)
    int channel_pid = 0;     // a waiter on its own connection: the pid that names its own channel (queue_waits.cpp)
    bool near = false;       // head or runner-up as far as it knows: it also wakes at the holder's stale deadline
    std::chrono::nanoseconds handoff{0};
    std::optional<std::chrono::steady_clock::time_point> probe_at;  // the runner-up's look at a late head
    std::chrono::nanoseconds poll_delay{0};  // a waiter that cannot LISTEN: its next look
    bool offered = false;  // a release's offer named it: its next try is the lean confirm_offer
    // A place this backend took whose liveness is a lease its looks renew.
    [[nodiscard]] bool lease_kept() const noexcept { return !pid_bound && handoff != std::chrono::nanoseconds::zero(); }
  };
  std::map<std::int64_t, QueuedHere> queued_here;
  // The entry of place `ticket`, made if new. Places left without a dequeue
  // or a try would pile up: at 256 the book starts over, and a wait that
  // finds its entry gone treats the place as one it did not take.
  QueuedHere& queued_entry(std::int64_t ticket) {
    if (queued_here.size() >= 256 && !queued_here.contains(ticket)) queued_here.clear();
    return queued_here[ticket];
  }
  // This backend has campaigned (an election's): its waits prepare the
  // election's queued try and release instead of the mutex's.
  bool campaigns = false;

  [[nodiscard]] bool unnamed_mode() const noexcept;
  // `table` must have passed validate_table_name.
  const TableStatements& statements(std::string_view table, bool unnamed);
  // $9 of the acquire: "-1" for the default grace, "0" off.
  [[nodiscard]] std::string grace_param() const;
  [[nodiscard]] std::chrono::nanoseconds bound_of(std::chrono::nanoseconds timeout) const;

  // Runs one operation within `bound`. An operation whose connection broke
  // under it is tried once more on a fresh one if that is safe (a read, an
  // idempotent write, or a write that surely did not run) and time is left;
  // otherwise a write's outcome is reported unknown, and the caller resolves
  // it by reading the row back.
  // A refusal (42501) of a statement on `table` names the GRANTs that fix it;
  // a write refused as read-only (25006) says whether a standby or a setting did.
  template <class T, class Body>
  Result<T> run(std::string_view what, Effect effect, const Bound& bound, Body&& body,
                std::string_view table = {}) noexcept {
    try {
      for (int attempt = 0;; ++attempt) {
        Outcome<T> outcome = tl::unexpected(postgres_detail::StatementFailure{});
        auto tried = try_once(what, bound,
                              [&](Session& session, const Bound& b) -> postgres_detail::StatementFailure* {
                                outcome = body(session, b);
                                if (outcome) return nullptr;
                                postgres_detail::name_the_grants(outcome.error(), table, session.user(), effect);
                                postgres_detail::name_the_read_only_cause(outcome.error(), session, b);
                                return &outcome.error();
                              });
        if (!tried) return tl::unexpected(std::move(tried.error()));
        if (outcome) {
          if constexpr (std::is_void_v<T>) return {};
          else return std::move(*outcome);
        }
        if (attempt == 0 && postgres_detail::may_retry(outcome.error(), effect) &&
            std::chrono::steady_clock::now() < bound.deadline)
          continue;
        return tl::unexpected(postgres_detail::to_error(outcome.error(), what, effect, secrets));
      }
    } catch (...) {
      return tl::unexpected(
          postgres_detail::to_error(postgres_detail::failure_from_current_exception(), what, effect, secrets));
    }
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

  // Whether this heartbeat must commit synchronously (the first after a new
  // server history, see BackendReportsHistory), and the note that one did.
  // A shared session decides per backend (DurableMark); an own connection
  // per connection, which is the same thing.
  bool durable_due(Session& session);
  void durable_done(Session& session);

 private:
  // One try of an operation on the connection this backend uses. An error:
  // no connection could be had (the attempt did not run).
  Result<void> try_once(std::string_view what, const Bound& bound, const postgres_detail::Attempt& attempt);
  // One try on our own (or the session's) connection.
  Result<void> try_own(postgres_detail::OwnSession& session, const Bound& bound,
                       const postgres_detail::Attempt& attempt);
};

}  // namespace pgmutex
