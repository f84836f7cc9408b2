// The session's I/O thread: its queue of statements, its idle wait in poll(),
// its timers. Beats are in beat_batch.cpp, watches in watch_book.cpp.
#include "session_core.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "dsn.hpp"
#include "host_attempts.hpp"

namespace pgmutex::postgres_detail {
namespace {

// The connection's options, each host's connect budget read from the DSN (host_attempts.hpp).
PostgresOptions own_options(const std::string& dsn, PostgresOptions options) {
  options.connect_timeout = connect_timeout_per_host(dsn, options.connect_timeout);
  return options;
}

}  // namespace

SessionCore::SessionCore(std::string dsn, SessionOptions options)
    : dsn_(std::move(dsn)),
      redacted_(redact_dsn(dsn_)),
      secrets_(secrets_of(dsn_)),
      options_(std::move(options)),
      own_(with_network_timeout(with_connect_timeout(dsn_, options_.postgres.connect_timeout),
                                options_.postgres.network_timeout),
           redacted_, secrets_, own_options(dsn_, options_.postgres)),
      wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), "pgmutex::Session: eventfd");
  own_.hear_own_notifications();  // one mutex's release wakes another's waiters on the same connection
}

SessionCore::~SessionCore() {
  stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void SessionCore::start(std::shared_ptr<SessionCore> self) {
  // The I/O thread's backend must not keep the core alive (it lives in it):
  // an aliasing pointer that owns nothing.
  io_backend_.emplace(SharedAccess::make(std::shared_ptr<SessionCore>(std::shared_ptr<void>(), this), nullptr));
  // The thread keeps the core alive until it ends: the last owner may let go
  // on the thread itself (a beat's callback that held the last mutex of the
  // session), and the core must outlive that callback's return.
  thread_ = std::thread([this, keep = std::move(self)] {
    thread_id_ = std::this_thread::get_id();
    run();
  });
}

void SessionCore::stop() noexcept {
  std::deque<Queued> unrun;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    // Whoever waits in the queue is told: their jobs never run. Owned jobs
    // are taken out and destroyed outside the lock: they may own mutexes of
    // this session (and an async operation's may hand its work elsewhere).
    for (auto& [key, place] : places_)
      if (place.waiting != nullptr) place.waiting->notify_all();  // it ends: the session stopped
    for (auto& [id, box] : election_boxes_)
      if (box.waiting != nullptr) box.waiting->notify_all();
    for (auto& [key, reading] : leader_readings_) reading->done.notify_all();
    for (auto& q : jobs_) {
      if (q.waited != nullptr) q.waited->cv.notify_all();
      else unrun.push_back(std::move(q));
    }
    std::erase_if(jobs_, [](const Queued& q) { return q.waited == nullptr; });
  }
  unrun.clear();
  wake();
  if (thread_.joinable()) {
    if (on_io_thread()) thread_.detach();  // the thread ends after the callback that stopped it
    else thread_.join();
  }
  // Pending beats, watches and async queue waits are dropped: their
  // callbacks may own mutexes of this session, so they are destroyed
  // outside the lock.
  std::vector<Beat> beats;
  std::map<WatchId, Watch> watches;
  std::vector<std::function<void(QueueWake)>> queue_waits;
  {
    std::lock_guard lock(mutex_);
    beats.swap(beats_);
    watches.swap(watches_);
    for (auto& [key, place] : places_)
      if (place.async_woken) queue_waits.push_back(std::exchange(place.async_woken, nullptr));
    tick_end_.reset();
  }
}

void SessionCore::wake() noexcept {
  if (wake_fd_ < 0) return;
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(wake_fd_, &one, sizeof one);
}

bool SessionCore::call(const std::function<void(OwnSession&)>& body, Deadline queued_until) {
  if (on_io_thread()) {
    body(own_);
    return true;
  }
  Job job{&body, false, false, {}};
  std::unique_lock lock(mutex_);
  if (stopping_) return false;
  jobs_.push_back({&job, {}});
  lock.unlock();
  wake();
  lock.lock();
  for (;;) {
    if (job.done) return true;
    if (!job.running) {
      if (stopping_ || job.cv.wait_until(lock, queued_until) == std::cv_status::timeout || stopping_) {
        if (job.done) return true;
        if (!job.running) {
          std::erase_if(jobs_, [&](const Queued& q) { return q.waited == &job; });
          return false;
        }
      }
      continue;
    }
    // Running: the body ends by its own deadline.
    job.cv.wait(lock, [&] { return job.done; });
  }
}

bool SessionCore::run_job(std::function<void()> job) {
  std::lock_guard lock(mutex_);
  if (stopping_) return false;
  jobs_.push_back({nullptr, std::move(job)});
  // Woken under the lock: the job may own the session's last share, and the
  // I/O thread, which takes it under this lock, may then end the session and
  // close the eventfd before a wake sent after the lock would be written.
  wake();
  return true;
}

void SessionCore::note_counts() noexcept {
  statements_ = own_.statements();
  connects_ = own_.connects();
}

std::uint64_t SessionCore::epoch() const noexcept { return own_.connected() ? own_.connects() : 0; }

std::chrono::nanoseconds SessionCore::recheck_every() const {
  return own_.unnamed() ? options_.unnamed_recheck_interval : options_.recheck_interval;
}

SessionStats SessionCore::stats() const noexcept {
  SessionStats s;
  s.statements = statements_.load();
  s.heartbeat_statements = heartbeat_statements_.load();
  s.heartbeats = heartbeats_.load();
  s.notifications = notifications_.load();
  s.rechecks = rechecks_.load();
  s.connects = connects_.load();
  return s;
}

Deadline SessionCore::next_timer(Deadline now) {
  std::lock_guard lock(mutex_);
  Deadline next = Deadline::max();
  if (tick_end_) next = std::min(next, *tick_end_);
  if (!watches_.empty()) {
    next = std::min(next, next_recheck_);
    for (const auto& [id, w] : watches_)
      if (w.check_at) next = std::min(next, *w.check_at);
  }
  for (const auto& [key, place] : places_)
    if (const auto due = async_due(place)) next = std::min(next, *due);
  if (!jobs_.empty()) next = now;
  return next;
}

void SessionCore::run() noexcept {
  for (;;) {
    Job* job = nullptr;
    std::function<void()> owned;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) break;
      if (!jobs_.empty()) {
        job = jobs_.front().waited;
        owned = std::move(jobs_.front().owned);
        jobs_.pop_front();
        if (job != nullptr) job->running = true;
      }
    }
    const bool ran = job != nullptr || owned;
    if (job != nullptr) {
      (*job->body)(own_);
      note_counts();  // before the caller returns, so its stats() include its statements
      std::lock_guard lock(mutex_);
      job->done = true;
      job->cv.notify_all();
    } else if (owned) {
      try {
        owned();
      } catch (...) {
        // A job's failure is its own to report (run_job's jobs do not throw).
      }
      owned = nullptr;  // what it owns goes now, not at the next job
      note_counts();
    }
    after_io();

    // Timers, checked after each job so a long queue never holds back a tick.
    const Deadline now = std::chrono::steady_clock::now();
    bool beats_due = false, checks_due = false, recheck_due = false, places_due = false;
    {
      std::lock_guard lock(mutex_);
      beats_due = tick_end_ && *tick_end_ <= now;
      recheck_due = !watches_.empty() && next_recheck_ <= now;
      for (const auto& [id, w] : watches_) checks_due = checks_due || (w.check_at && *w.check_at <= now);
      for (const auto& [key, place] : places_) {
        const auto due = async_due(place);
        places_due = places_due || (due && *due <= now);
      }
    }
    if (places_due) wake_due_places(now);
    if (beats_due) {
      send_beats();
      after_io();
    }
    if (checks_due || recheck_due) {
      check_watches(recheck_due);
      after_io();
    }
    if (ran || beats_due || checks_due || recheck_due || places_due) continue;

    // Idle: the connection's socket (NOTIFYs, or its loss), new work, the next timer.
    const Deadline next = next_timer(std::chrono::steady_clock::now());
    int timeout_ms = -1;
    if (next != Deadline::max())
      timeout_ms = static_cast<int>(std::clamp<long long>(
          std::chrono::ceil<std::chrono::milliseconds>(next - std::chrono::steady_clock::now()).count(), 0, 1 << 30));
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {own_.socket(), POLLIN, 0}};
    const int n = ::poll(fds, fds[1].fd >= 0 ? 2 : 1, timeout_ms);
    if (n < 0 && errno != EINTR) continue;
    if (fds[0].revents != 0) {
      std::uint64_t count = 0;
      [[maybe_unused]] const auto r = ::read(wake_fd_, &count, sizeof count);
    }
    if (fds[1].fd >= 0 && fds[1].revents != 0) {
      own_.consume_input();  // drops the connection if it is gone: after_io wakes the waiters
      after_io();
    }
  }
}

}  // namespace pgmutex::postgres_detail
