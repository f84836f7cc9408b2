// Waiting for a lock's release: its NOTIFY channel, a wait on it (LISTEN, or
// without it, reads of the row with backoff), and the LISTEN a shared
// session's watches share.
#include <algorithm>
#include <thread>

#include "backend_impl.hpp"
#include "statement_values.hpp"

namespace pgmutex {

using namespace postgres_detail;

namespace postgres_detail {

Outcome<bool> ReleasePolls::wait(Session& session, const TableStatements& st, LockRef lock_ref, Deadline wait_until,
                                 std::chrono::nanoseconds read_timeout) {
  std::string key = std::string(lock_ref.table);
  key.push_back('\0');
  key += lock_ref.lock_name;
  if (polls_.size() >= max_polled_locks && !polls_.contains(key)) polls_.clear();
  Poll& poll = polls_[key];
  for (;;) {
    const auto left = wait_until - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) return false;
    if (left < poll.delay) {
      std::this_thread::sleep_for(left);
      return false;
    }
    std::this_thread::sleep_for(poll.delay);
    poll.delay = std::min(poll.delay * 2, max_poll);
    auto rows = session.run(st.inspect, {std::string(lock_ref.lock_name)}, Bound::from(read_timeout));
    if (!rows) return tl::unexpected(std::move(rows.error()));
    const bool gone = rows->empty();
    const LockRow row = gone ? LockRow{} : row_from(*rows, 0);
    if (gone || (!poll.instance.empty() && (row.instance_id != poll.instance || row.fence != poll.fence))) {
      polls_.erase(key);
      return true;
    }
    poll.instance = row.instance_id;
    poll.fence = row.fence;
  }
}

}  // namespace postgres_detail

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
          return impl_->polls.wait(session, impl_->statements(lock_ref.table, true), lock_ref, wait_until,
                                   impl_->bound_of({}));
        auto oid = session.table_oid(lock_ref.table, bound);
        if (!oid) return tl::unexpected(std::move(oid.error()));
        return session.wait_for_notification(postgres_detail::release_channel(*oid, lock_ref.lock_name), bound,
                                             wait_until);
      },
      lock_ref.table);
}

namespace postgres_detail {

Result<std::string> SharedAccess::listen(PostgresBackend& backend, LockRef lock_ref, std::string_view suffix) noexcept {
  auto& impl = backend.impl_;
  if (!impl) return moved_from();
  if (auto valid = validate_table_name(lock_ref.table); !valid) return tl::unexpected(std::move(valid.error()));
  std::lock_guard lock(impl->mutex);
  return impl->run<std::string>(
      "listen for releases of " + lock_context(lock_ref), Effect::read, Bound::from(impl->bound_of({})),
      [&](Session& session, const Bound& bound) -> Outcome<std::string> {
        auto oid = session.table_oid(lock_ref.table, bound);
        if (!oid) return tl::unexpected(std::move(oid.error()));
        std::string channel = postgres_detail::release_channel(*oid, lock_ref.lock_name) + std::string(suffix);
        auto& own_session = dynamic_cast<OwnSession&>(session);
        if (auto listened = own_session.listen(channel, bound); !listened)
          return tl::unexpected(std::move(listened.error()));
        return channel;
      },
      lock_ref.table);
}

}  // namespace postgres_detail
}  // namespace pgmutex
