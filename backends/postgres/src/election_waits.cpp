// PostgresBackend's observers (issue 18): waiting for a lock's election
// changes without a statement. On its own connection the backend LISTENs on
// the lock's channel plus "_e" and poll()s the socket; each notification
// carries a whole change (election_rules.hpp). A connection that is new, or
// not listening yet, says resync: the observer reads the leader after the
// LISTEN, so nothing announced in between is missed. A backend that cannot
// LISTEN (a pool's, a transaction pooler's) sleeps a poll and says resync:
// the observer reads again (the one polling case).
#include <algorithm>
#include <poll.h>

#include "backend_impl.hpp"
#include "election_rules.hpp"
#include "stop_fd.hpp"

namespace pgmutex {

using namespace postgres_detail;

namespace {
using Clock = std::chrono::steady_clock;
// How long a backend that cannot LISTEN waits between readings.
constexpr std::chrono::nanoseconds unheard_poll = std::chrono::milliseconds(500);
}  // namespace

Result<ElectionWake> PostgresBackend::wait_for_election(LockRef lock, std::chrono::nanoseconds timeout,
                                                        std::stop_token stop) noexcept {
  if (!impl_) return moved_from();
  if (auto valid = validate_table_name(lock.table); !valid) return tl::unexpected(std::move(valid.error()));
  const std::string what = "wait for the election of " + lock_context(lock);
  try {
    std::lock_guard guard(impl_->mutex);
    if (!impl_->own || impl_->own->unnamed()) {
      StopFd stopped(stop);
      ElectionWake wake;
      pollfd p{stopped.fd(), POLLIN, 0};
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(std::min(timeout, unheard_poll)).count();
      if (::poll(&p, 1, static_cast<int>(std::max<long long>(ms, 0))) == 0) wake.resync = true;
      return wake;
    }
  } catch (...) {
    return tl::unexpected(to_error(failure_from_current_exception(), what, Effect::read, impl_->secrets));
  }
  // Not listening yet (a new backend, or a new connection after a lost
  // one): connect if need be, LISTEN, and say resync.
  std::string channel;
  auto began = impl_->on_table<bool>(
      lock.table, what, Effect::read, {},
      [&](Session& session, const Bound& bound, const TableStatements&) -> Outcome<bool> {
        auto oid = session.table_oid(lock.table, bound);
        if (!oid) return tl::unexpected(std::move(oid.error()));
        auto& own = dynamic_cast<OwnSession&>(session);
        channel = postgres_detail::release_channel(*oid, lock.lock_name) + "_e";
        if (own.listening(channel)) return false;
        if (auto listened = own.listen(channel, bound); !listened) return tl::unexpected(std::move(listened.error()));
        (void)own.take_payloads(channel);  // older than the reading that follows
        return true;
      });
  if (!began) return tl::unexpected(std::move(began.error()));
  if (*began) return ElectionWake{{}, true};
  try {
    std::lock_guard guard(impl_->mutex);
    OwnSession& own = *impl_->own;
    // At most a day at a time: no overflow for "forever" (nanoseconds::max()).
    const auto deadline = Clock::now() + std::clamp(timeout, std::chrono::nanoseconds::zero(),
                                                    std::chrono::nanoseconds(std::chrono::hours(24)));
    StopFd stopped(stop);
    ElectionWake wake;
    auto failed = [&](StatementFailure failure) -> Result<ElectionWake> {
      return tl::unexpected(to_error(failure, what, Effect::read, impl_->secrets));
    };
    if (!own.listening(channel)) return ElectionWake{{}, true};  // the connection went meanwhile
    for (;;) {
      for (const std::string& payload : own.take_payloads(channel))
        if (auto notice = election_notice_of(payload)) wake.notices.push_back(std::move(*notice));
      if (!wake.notices.empty()) return wake;
      if (stop.stop_requested() || Clock::now() >= deadline) return wake;
      auto woke = own.await_input(deadline, stopped.fd());
      if (!woke) return failed(std::move(woke.error()));
      if (*woke == PqConnection::Woke::wake_fd) return wake;
      if (*woke != PqConnection::Woke::input) return wake;  // the deadline
    }
  } catch (...) {
    return tl::unexpected(to_error(failure_from_current_exception(), what, Effect::read, impl_->secrets));
  }
}

static_assert(BackendWaitsForElections<PostgresBackend>);

}  // namespace pgmutex
