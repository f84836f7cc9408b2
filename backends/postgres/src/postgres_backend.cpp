// PostgresBackend itself: made in each of its three ways (its own connection,
// a pool's, or a pgmutex::Session's), and what it reports between operations
// (the session, history and durability of the last one). The operations live
// in backend_operations.cpp, heartbeat_many.cpp and release_waits.cpp.
#include "pgmutex/postgres_backend.hpp"

#include "backend_impl.hpp"

namespace pgmutex {

using namespace postgres_detail;

PostgresBackend::PostgresBackend(std::string dsn, PostgresOptions options)
    : impl_(std::make_unique<Impl>(dsn, options)) {}
PostgresBackend::PostgresBackend(std::shared_ptr<ConnectionSource> pool, PostgresOptions options)
    : impl_(std::make_unique<Impl>(std::move(pool), options)) {}
PostgresBackend::PostgresBackend(PostgresBackend&&) noexcept = default;
PostgresBackend& PostgresBackend::operator=(PostgresBackend&&) noexcept = default;
PostgresBackend::~PostgresBackend() = default;

PostgresBackend PostgresBackend::share() const {
  if (!impl_) return PostgresBackend(std::unique_ptr<Impl>());  // moved from: fails as this one does
  if (impl_->core) return SharedAccess::make(impl_->core, std::make_shared<DurableMark>());
  if (impl_->pool) return PostgresBackend(impl_->pool, impl_->options);
  return PostgresBackend(impl_->dsn, impl_->options);
}

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

static_assert(Backend<PostgresBackend>);
static_assert(BackendReportsSession<PostgresBackend>);
static_assert(BackendReportsHistory<PostgresBackend>);
static_assert(BackendWaitsForRelease<PostgresBackend>);
static_assert(BackendBatchesHeartbeats<PostgresBackend>);
static_assert(BackendReportsCommitMode<PostgresBackend>);
static_assert(BackendReportsDurability<PostgresBackend>);
static_assert(BackendKeepsElections<PostgresBackend>);
static_assert(BackendElectsInOneStatement<PostgresBackend>);

// ---- a pgmutex::Session's access ---------------------------------------------

PostgresBackend::PostgresBackend(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}

namespace postgres_detail {

PostgresBackend SharedAccess::make(std::shared_ptr<SharedConnection> core, std::shared_ptr<DurableMark> mark) {
  return PostgresBackend(std::make_unique<PostgresBackend::Impl>(std::move(core), std::move(mark)));
}

}  // namespace postgres_detail
}  // namespace pgmutex
