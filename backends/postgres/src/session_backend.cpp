// pgmutex::Session and SessionBackend: the public faces of SessionCore. A
// SessionBackend is a PostgresBackend whose statements run on the session's
// connection, plus the session's batched heartbeats and shared waits.
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "pgmutex/session.hpp"
#include "session_core.hpp"

namespace pgmutex {

using postgres_detail::DurableMark;
using postgres_detail::SharedAccess;

struct Session::Core : postgres_detail::SessionCore {
  using SessionCore::SessionCore;
};

namespace {

// "SessionOptions::heartbeat_tick must be positive (got -5ms)": the option and the rule.
Result<void> check_positive(std::chrono::nanoseconds value, const char* name) {
  if (value > std::chrono::nanoseconds::zero()) return {};
  return fail(Errc::invalid_argument, std::string("SessionOptions::") + name + " must be positive (got " +
                                          std::to_string(value.count()) + " ns)");
}

}  // namespace

// ---- Session ----------------------------------------------------------------

Result<std::shared_ptr<Session>> Session::create(nothrow_t, std::string dsn, SessionOptions options) noexcept {
  for (auto checked : {check_positive(options.heartbeat_tick, "heartbeat_tick"),
                       check_positive(options.recheck_interval, "recheck_interval"),
                       check_positive(options.unnamed_recheck_interval, "unnamed_recheck_interval"),
                       check_positive(options.postgres.default_timeout, "postgres.default_timeout")})
    if (!checked) return tl::unexpected(std::move(checked.error()));
  try {
    auto core = std::make_shared<Core>(std::move(dsn), std::move(options));
    core->start(core);
    std::shared_ptr<Session> session(new Session(std::move(core)));
    session->self_ = session;
    return session;
  } catch (const std::exception& e) {
    return fail(Errc::backend_error, std::string("cannot start a pgmutex::Session: ") + e.what());
  }
}

std::shared_ptr<Session> Session::create(std::string dsn, SessionOptions options) {
  return value_or_throw(create(nothrow, std::move(dsn), std::move(options)));
}

Session::Session(std::shared_ptr<Core> core) : core_(std::move(core)) {}

Session::~Session() {
  if (core_) core_->stop();
}

Result<void> Session::connect() noexcept {
  // A backend of its own: the I/O thread's is for the I/O thread alone.
  PostgresBackend backend = SharedAccess::make(core_, nullptr);
  return backend.connect();
}

SessionBackend Session::backend() { return SessionBackend(self_.lock()); }

SessionStats Session::stats() const noexcept { return core_->stats(); }

std::string Session::redacted_dsn() const { return core_->redacted(); }

const SessionOptions& Session::options() const noexcept { return core_->options(); }

// ---- SessionBackend ---------------------------------------------------------

struct SessionBackend::Impl {
  explicit Impl(std::shared_ptr<Session> s)
      : session(std::move(s)), mark(std::make_shared<DurableMark>()), backend(SharedAccess::make(session->core_, mark)) {}
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    if (election_box) core().close_election_box(*election_box);
  }
  std::shared_ptr<Session> session;
  std::shared_ptr<DurableMark> mark;  // shared with `backend`: its acquires and durable heartbeats note it
  PostgresBackend backend;
  // This backend's observer's box of election changes, opened on its first wait.
  std::optional<postgres_detail::SessionCore::ElectionBoxId> election_box;
  // Before a queued try: an offer the I/O thread heard for its place goes
  // to `backend`, whose try is then the lean confirm.
  void before_queued_try(const AcquireRequest& request) {
    if (request.queue_ticket != 0 && core().take_offer(request.lock.table, request.queue_ticket))
      SharedAccess::offered(backend, request.queue_ticket);
  }
  // After it: a queued try that won, or found its place gone, ends the
  // place's wait; one that found the place the runner-up of a head that may
  // let its offer lapse arms the place's probe.
  void after_queued_try(const AcquireRequest& request, const Result<AcquireResult>& tried) {
    if (request.queue_ticket == 0 || !tried) return;
    if (tried->acquired || tried->queue_place_lost)
      core().forget_place(request.lock.table, request.queue_ticket);
    else if (const auto probe_at = SharedAccess::take_probe(backend, request.queue_ticket))
      core().watch_head(request.lock.table, request.queue_ticket, *probe_at);
  }
  [[nodiscard]] postgres_detail::SessionCore& core() const { return *session->core_; }
};

namespace {
tl::unexpected<Error> moved_from() { return fail(Errc::invalid_argument, "this SessionBackend was moved from"); }
}  // namespace

SessionBackend::SessionBackend(std::shared_ptr<Session> session) {
  if (!session) throw std::invalid_argument("pgmutex::SessionBackend needs a session (Session::create)");
  impl_ = std::make_unique<Impl>(std::move(session));
}
SessionBackend::SessionBackend(SessionBackend&&) noexcept = default;
SessionBackend& SessionBackend::operator=(SessionBackend&&) noexcept = default;
SessionBackend::~SessionBackend() = default;

Result<void> SessionBackend::create_schema(std::string_view table) noexcept {
  if (!impl_) return moved_from();
  return impl_->backend.create_schema(table);
}
Result<AcquireResult> SessionBackend::try_acquire(const AcquireRequest& request) noexcept {
  if (!impl_) return moved_from();
  impl_->before_queued_try(request);
  auto tried = impl_->backend.try_acquire(request);
  impl_->after_queued_try(request, tried);
  return tried;
}
Result<void> SessionBackend::heartbeat(const HolderKey& key) noexcept {
  if (!impl_) return moved_from();
  return impl_->backend.heartbeat(key);
}
Result<void> SessionBackend::release(const HolderKey& key) noexcept {
  if (!impl_) return moved_from();
  return impl_->backend.release(key);
}
Result<std::optional<LockRow>> SessionBackend::inspect(LockRef lock) noexcept {
  if (!impl_) return moved_from();
  return impl_->backend.inspect(lock);
}
Result<std::vector<LockRow>> SessionBackend::list(std::string_view table) noexcept {
  if (!impl_) return moved_from();
  return impl_->backend.list(table);
}
Result<std::optional<LockRow>> SessionBackend::force_release(LockRef lock) noexcept {
  if (!impl_) return moved_from();
  return impl_->backend.force_release(lock);
}
Result<std::vector<bool>> SessionBackend::heartbeat_many(std::span<const HolderKey> keys) noexcept {
  if (!impl_) return moved_from();
  return impl_->backend.heartbeat_many(keys);
}

bool SessionBackend::heartbeat_async(const HolderKey& key, BeatCallback done) noexcept {
  if (!impl_ || !done) return false;  // nothing to answer, or nobody to tell
  const auto timeout = key.timeout > std::chrono::nanoseconds::zero() ? key.timeout
                                                                      : impl_->core().options().postgres.default_timeout;
  try {
    return impl_->core().add_beat({std::string(key.lock.table), std::string(key.lock.lock_name), std::string(key.instance_id),
                            key.fence, key.token, key.timeout, std::chrono::steady_clock::now() + timeout,
                            impl_->mark, std::move(done), key.durable});
  } catch (...) {
    return false;  // out of memory copying the key: the caller keeps `done` unrun
  }
}

Result<bool> SessionBackend::wait_until_free(const WatchRequest& watch, std::chrono::nanoseconds timeout,
                                             std::stop_token stop) noexcept {
  if (!impl_) return moved_from();
  try {
    struct Waiter {
      std::mutex mutex;
      std::condition_variable cv;
      bool woken = false;
      bool stopped = false;
    };
    auto waiter = std::make_shared<Waiter>();
    const auto until = std::chrono::steady_clock::now() + std::max(timeout, std::chrono::nanoseconds::zero());
    auto id = impl_->core().add_watch(watch, [waiter] {
      std::lock_guard lock(waiter->mutex);
      waiter->woken = true;
      waiter->cv.notify_all();
    });
    if (!id) return tl::unexpected(std::move(id.error()));
    std::stop_callback on_stop(stop, [waiter] {
      std::lock_guard lock(waiter->mutex);
      waiter->stopped = true;
      waiter->cv.notify_all();
    });
    std::unique_lock lock(waiter->mutex);
    waiter->cv.wait_until(lock, until, [&] { return waiter->woken || waiter->stopped; });
    const bool woken = waiter->woken, stopped = waiter->stopped;
    lock.unlock();
    if (woken) return true;
    // Cancelled in time: false. Too late: it was being woken, as good as woken.
    const bool cancelled = impl_->core().cancel_watch(*id);
    return !cancelled && !stopped;
  } catch (...) {
    return fail(Errc::backend_unavailable, "wait until lock '" + std::string(watch.lock.lock_name) +
                                               "' is free: out of memory");
  }
}

Result<WatchId> SessionBackend::watch_async(const WatchRequest& watch, std::function<void()> woken) noexcept {
  if (!impl_) return moved_from();
  try {
    return impl_->core().add_watch(watch, std::move(woken));
  } catch (...) {
    return fail(Errc::backend_unavailable, "watch lock '" + std::string(watch.lock.lock_name) + "': out of memory");
  }
}

bool SessionBackend::cancel_watch(WatchId id) noexcept { return impl_ && impl_->core().cancel_watch(id); }

bool SessionBackend::run_job(std::function<void()> job) noexcept {
  if (!impl_) return false;
  try {
    return impl_->core().run_job(std::move(job));
  } catch (...) {
    return false;  // no memory to queue it: destroyed unrun, as when stopped
  }
}

std::uint64_t SessionBackend::session() const noexcept { return impl_ ? impl_->backend.session() : 0; }
std::uint64_t SessionBackend::history() const noexcept { return impl_ ? impl_->backend.history() : 0; }
HeartbeatDurability SessionBackend::last_heartbeat_durability() const noexcept {
  return impl_ ? impl_->backend.last_heartbeat_durability() : HeartbeatDurability{};
}
bool SessionBackend::heartbeat_commits_asynchronously() const noexcept {
  return impl_ && impl_->backend.heartbeat_commits_asynchronously();
}

Result<QueuePlace> SessionBackend::enqueue(const AcquireRequest& request,
                                           std::chrono::nanoseconds handoff_deadline) noexcept {
  if (!impl_) return moved_from();
  try {
    return impl_->core().enqueue(request, handoff_deadline);
  } catch (...) {
    return fail(Errc::backend_unavailable, "enqueue for lock '" + std::string(request.lock.lock_name) + "': out of memory");
  }
}

Result<LeaderRecord> SessionBackend::leader(LockRef lock, std::chrono::nanoseconds stale_threshold) noexcept {
  if (!impl_) return moved_from();
  try {
    return impl_->core().read_leader(lock, stale_threshold);
  } catch (const std::bad_alloc&) {
    return fail(Errc::backend_unavailable, "read who leads lock '" + std::string(lock.lock_name) + "': out of memory");
  }
}

Result<LeaderRecord> SessionBackend::announce(const HolderKey& key, std::string_view value) noexcept {
  if (!impl_) return moved_from();
  return impl_->backend.announce(key, value);
}

Result<LeaderRecord> SessionBackend::vacate(const HolderKey& key) noexcept {
  if (!impl_) return moved_from();
  return impl_->backend.vacate(key);
}

Result<ElectionWake> SessionBackend::wait_for_election(LockRef lock, std::chrono::nanoseconds timeout,
                                                       std::stop_token stop) noexcept {
  if (!impl_) return moved_from();
  try {
    if (!impl_->election_box) impl_->election_box = impl_->core().open_election_box();
    return impl_->core().wait_for_election(*impl_->election_box, lock, timeout, std::move(stop));
  } catch (const std::bad_alloc&) {
    return fail(Errc::backend_unavailable, "wait for the election of lock '" + std::string(lock.lock_name) +
                                               "': out of memory");
  }
}

static_assert(BackendWaitsForElections<SessionBackend>);

Result<AcquireResult> SessionBackend::try_acquire(const AcquireRequest& request,
                                                  GrantAnnouncement& announcement) noexcept {
  if (!impl_) return moved_from();
  impl_->before_queued_try(request);
  auto tried = impl_->backend.try_acquire(request, announcement);
  impl_->after_queued_try(request, tried);
  return tried;
}

Result<void> SessionBackend::release_vacating(const HolderKey& key) noexcept {
  if (!impl_) return moved_from();
  return impl_->backend.release_vacating(key);
}

Result<void> SessionBackend::dequeue(const AcquireRequest& request, std::int64_t ticket) noexcept {
  if (!impl_) return moved_from();
  impl_->core().forget_place(request.lock.table, ticket);
  return impl_->backend.dequeue(request, ticket);
}

Result<QueueWake> SessionBackend::wait_in_queue(const WatchRequest& w, std::int64_t ticket,
                                                std::chrono::nanoseconds timeout, std::stop_token stop) noexcept {
  if (!impl_) return moved_from();
  if (auto valid = validate_table_name(w.lock.table); !valid) return tl::unexpected(std::move(valid.error()));
  try {
    return impl_->core().wait_in_queue(w, ticket, timeout, std::move(stop));
  } catch (...) {
    return fail(Errc::backend_unavailable, "wait in the queue of lock '" + std::string(w.lock.lock_name) + "': out of memory");
  }
}

Result<void> SessionBackend::wait_in_queue_async(const WatchRequest& w, std::int64_t ticket,
                                                 std::function<void(QueueWake)> woken) noexcept {
  if (!impl_) return moved_from();
  if (auto valid = validate_table_name(w.lock.table); !valid) return tl::unexpected(std::move(valid.error()));
  try {
    return impl_->core().wait_in_queue_async(w, ticket, std::move(woken));
  } catch (...) {
    return fail(Errc::backend_unavailable, "wait in the queue of lock '" + std::string(w.lock.lock_name) + "': out of memory");
  }
}

bool SessionBackend::cancel_queue_wait(LockRef lock, std::int64_t ticket) noexcept {
  try {
    return impl_ && impl_->core().cancel_queue_wait(lock.table, ticket);
  } catch (...) {
    return false;  // out of memory making the key: it runs, and its try finds the operation done
  }
}

SessionBackend SessionBackend::share() const { return SessionBackend(owner()); }

const std::shared_ptr<Session>& SessionBackend::owner() const noexcept {
  static const std::shared_ptr<Session> none;
  return impl_ ? impl_->session : none;
}

namespace postgres_detail {
SessionCore& SessionAccess::core(pgmutex::Session& session) noexcept { return *session.core_; }
const std::shared_ptr<DurableMark>& SessionAccess::mark(const SessionBackend& backend) noexcept {
  static const std::shared_ptr<DurableMark> none;
  return backend.impl_ ? backend.impl_->mark : none;
}
}  // namespace postgres_detail

static_assert(Backend<SessionBackend>);
static_assert(BackendBeatsAsynchronously<SessionBackend>);
static_assert(BackendWatchesLocks<SessionBackend>);
static_assert(BackendWatchesLocksAsynchronously<SessionBackend>);
static_assert(BackendBatchesHeartbeats<SessionBackend>);
static_assert(BackendReportsSession<SessionBackend>);
static_assert(BackendReportsHistory<SessionBackend>);
static_assert(BackendReportsCommitMode<SessionBackend>);
static_assert(BackendRunsJobs<SessionBackend>);
static_assert(BackendWaitsInQueue<SessionBackend>);
static_assert(BackendQueuesAsynchronously<SessionBackend>);
static_assert(BackendKeepsElections<SessionBackend>);
static_assert(BackendElectsInOneStatement<SessionBackend>);

}  // namespace pgmutex
