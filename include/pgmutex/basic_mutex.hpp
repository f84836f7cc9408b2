// BasicMutex: one named lock in a lock table, over four policies.
//
//   Backend   the lock table (PostgresBackend, MemoryBackend, ...)
//   Clock     the client's monotonic time (cadence, waits, watchdog)
//   Metrics   hooks (any subset; absent ones cost nothing)
//   Executor  where the automatic heartbeat and timed waits run
//
// Every operation has an expected-returning form (pass pgmutex::nothrow) and a
// throwing form built on it.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "pgmutex/backend.hpp"
#include "pgmutex/clock.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/executor.hpp"
#include "pgmutex/detail/light_mutex.hpp"
#include "pgmutex/guard.hpp"
#include "pgmutex/metrics.hpp"
#include "pgmutex/options.hpp"
#include "pgmutex/singleton.hpp"

namespace pgmutex {

template <Backend B, Clock C = SteadyClock, Metrics M = NoMetrics, Executor E = ThreadExecutor>
class BasicMutex {
  class State;

 public:
  using backend_type = B;
  using clock_type = C;
  using metrics_type = M;
  using executor_type = E;
  using guard_type = BasicGuard<State>;
  using duration = std::chrono::nanoseconds;

  // Throws InvalidArgumentError naming the option and the rule it breaks.
  BasicMutex(B backend, Options options, C clock = {}, M metrics = {}, E executor = {})
      : state_(std::make_unique<State>(value_or_throw(validate(std::move(options), traits_of(backend))), std::move(backend),
                                       std::move(clock), std::move(metrics), std::move(executor))) {}

  static Result<BasicMutex> create(B backend, Options options, C clock = {}, M metrics = {}, E executor = {}) {
    auto valid = validate(std::move(options), traits_of(backend));
    if (!valid) return tl::unexpected(std::move(valid.error()));
    return BasicMutex(std::make_unique<State>(std::move(*valid), std::move(backend), std::move(clock),
                                              std::move(metrics), std::move(executor)));
  }

  BasicMutex(BasicMutex&&) noexcept = default;
  BasicMutex& operator=(BasicMutex&&) noexcept = default;
  ~BasicMutex() = default;

  [[nodiscard]] const ValidOptions& options() const noexcept { return state_->options; }
  [[nodiscard]] std::string_view lock_name() const noexcept { return state_->options.lock_name; }
  [[nodiscard]] std::string_view instance_id() const noexcept { return state_->options.instance_id; }
  [[nodiscard]] M& metrics() noexcept { return state_->metrics; }

  // Creates the lock table if missing, upgrades one without a fence column. Idempotent.
  Result<void> create_schema(nothrow_t) { return state_->create_schema(); }
  void create_schema() { value_or_throw(create_schema(nothrow)); }

  // One try. An empty guard (false) if another instance holds the lock; an
  // error only if the backend failed or this object already holds the lock.
  Result<guard_type> try_acquire(nothrow_t) { return state_->try_acquire(); }
  guard_type try_acquire() { return value_or_throw(try_acquire(nothrow)); }

  // Tries until acquired, `timeout` passes (empty guard, why() == timeout), or
  // `stop` is requested (empty guard, why() == cancelled). No timeout: waits forever.
  Result<guard_type> acquire(nothrow_t, std::optional<duration> timeout = std::nullopt, std::stop_token stop = {}) {
    return state_->acquire(timeout, std::move(stop));
  }
  guard_type acquire(std::optional<duration> timeout = std::nullopt, std::stop_token stop = {}) {
    return value_or_throw(acquire(nothrow, timeout, std::move(stop)));
  }

  // Releases the current grant (the guard's destructor does it too).
  Result<void> release(nothrow_t) { return state_->release_current(); }
  void release() { value_or_throw(release(nothrow)); }

  // A manual heartbeat. Errc::lock_not_held if not held or the lease was lost.
  Result<void> heartbeat(nothrow_t) { return state_->heartbeat_current(); }
  void heartbeat() { value_or_throw(heartbeat(nothrow)); }

  // The lock's row as the backend sees it now, if anyone holds it.
  Result<std::optional<LockRow>> inspect(nothrow_t) { return state_->inspect(); }
  std::optional<LockRow> inspect() { return value_or_throw(inspect(nothrow)); }

  [[nodiscard]] bool held() const { return state_->is_held(); }

  // Wraps `fn` so that each call runs it only if the lock is acquired (one try,
  // or waiting per `wait`), passing it the guard or its stop_token if it takes
  // one. The mutex must outlive the wrapper.
  template <class F>
  Singleton<BasicMutex, F> singleton(F fn, WaitPolicy wait = {}) {
    return Singleton<BasicMutex, F>(*this, std::move(fn), wait);
  }

 private:
  static BackendTraits traits_of(const B& backend) noexcept {
    if constexpr (BackendReportsCommitMode<B>) return BackendTraits{backend.heartbeat_commits_asynchronously()};
    else return BackendTraits{};
  }

  explicit BasicMutex(std::unique_ptr<State> state) : state_(std::move(state)) {}

  // Everything lives here, at a stable address, so that the guard and the
  // heartbeat task can point at it while the BasicMutex itself moves.
  class State {
   public:
    using time_point = typename C::time_point;

    State(ValidOptions o, B b, C c, M m, E e)
        : options(std::move(o)), backend(std::move(b)), clock(std::move(c)), metrics(std::move(m)),
          executor(std::move(e)) {}

    State(const State&) = delete;
    State& operator=(const State&) = delete;

    ~State() {
      // Stop every wake-up first (cancel waits for one that is running), then,
      // if a guard outlived its mutex, release so nobody waits out the threshold.
      std::vector<Wakeup> pending;
      {
        detail::LightLock lock(mutex);
        closing = true;
        pending.swap(wakeups);
      }
      for (const Wakeup& w : pending) executor.cancel(w.task);
      if (held) (void)release_grant(generation);
    }

    ValidOptions options;
    [[no_unique_address]] B backend;
    [[no_unique_address]] C clock;
    [[no_unique_address]] M metrics;
    [[no_unique_address]] E executor;

    // ---- operations ------------------------------------------------------

    Result<void> create_schema() {
      detail::LightLock lock(mutex);
      return with_context(backend.create_schema(options.table));
    }

    Result<std::optional<LockRow>> inspect() {
      detail::LightLock lock(mutex);
      return with_context(backend.inspect(lock_ref()));
    }

    bool is_held() const {
      detail::LightLock lock(mutex);
      return held && !lost;
    }

    Result<guard_type> try_acquire() {
      detail::LightLock lock(mutex);
      if (held && !lost)
        return fail(Errc::already_acquired, context() + " is already held through this object (fence " +
                                                std::to_string(fence) + "); release it before acquiring again");
      time_point sent = clock.now();
      auto outcome = backend.try_acquire(AcquireRequest{lock_ref(), options.instance_id, options.stale_threshold});
      if (!outcome && outcome.error() == Errc::outcome_unknown) {
        if (auto resolved = resolve_unknown_acquire(sent)) return std::move(*resolved);
        // Nothing landed and nobody holds the lock: one more try says which.
        sent = clock.now();
        outcome = backend.try_acquire(AcquireRequest{lock_ref(), options.instance_id, options.stale_threshold});
        if (!outcome && outcome.error() == Errc::outcome_unknown) {
          if (auto resolved = resolve_unknown_acquire(sent)) return std::move(*resolved);
          return fail(Errc::outcome_unknown, context() + ": two acquires in a row lost their replies");
        }
      }
      if (!outcome) return with_context<guard_type>(tl::unexpected(std::move(outcome.error())));
      if (outcome->acquired) {
        unknown_acquire_pending = false;
        if (outcome->reclaimed) call_stale_reclaimed(metrics, options.lock_name, options.instance_id, outcome->holder);
        return grant(outcome->fence, sent);
      }
      // Our own row that an earlier acquire with a lost reply did create. Its
      // lease counts from the row's last heartbeat, not from now.
      if (unknown_acquire_pending && is_our_new_row(outcome->holder, outcome->fence)) {
        unknown_acquire_pending = false;
        return grant(outcome->fence, sent - age(outcome->holder_age_s));
      }
      return contended(std::move(outcome->holder), outcome->fence, outcome->holder_age_s);
    }

    Result<guard_type> acquire(std::optional<duration> timeout, std::stop_token stop) {
      const time_point start = clock.now();
      for (;;) {
        auto attempt = try_acquire();
        const bool transient = !attempt && (attempt.error() == Errc::backend_unavailable ||
                                            attempt.error() == Errc::outcome_unknown);
        if (!attempt && !transient) return attempt;
        if (attempt && *attempt) return attempt;

        duration wait = options.poll_interval;
        if (timeout) {
          const duration left = *timeout - std::chrono::duration_cast<duration>(clock.now() - start);
          if (left <= duration::zero()) {
            if (!attempt) return attempt;  // the backend never answered: say so, not "timeout"
            return guard_type(Errc::timeout, std::move(attempt->holder_));
          }
          wait = std::min(wait, left);
        }
        if (stop.stop_requested()) return guard_type(Errc::cancelled, attempt ? std::move(attempt->holder_) : std::nullopt);
        bool waited = false;
        if constexpr (BackendWaitsForRelease<B>) {
          std::unique_lock lock(mutex);
          waited = backend.wait_for_release(lock_ref(), wait).has_value();
        }
        // No way to be told of a release, or it failed just now: sleep through the poll interval.
        if (!waited && executor.wait_for(wait, stop))
          return guard_type(Errc::cancelled, attempt ? std::move(attempt->holder_) : std::nullopt);
      }
    }

    Result<void> release_current() {
      std::uint64_t current = 0;
      {
        detail::LightLock lock(mutex);
        if (!held) return fail(Errc::lock_not_held, context() + " is not held through this object");
        current = generation;
      }
      return release_grant(current);
    }

    Result<void> heartbeat_current() {
      std::uint64_t current = 0;
      {
        detail::LightLock lock(mutex);
        current = generation;
      }
      return heartbeat_grant(current);
    }

    // ---- what the guard calls --------------------------------------------

    bool grant_lost(std::uint64_t which) const {
      detail::LightLock lock(mutex);
      // An older grant whose guard is still alive ended by loss, or it would
      // have been released before this object could acquire again.
      return which == generation ? held && lost : which == lost_generation;
    }

    std::stop_token grant_stop_token(std::uint64_t which) {
      detail::LightLock lock(mutex);
      if (which != generation) {
        std::stop_source ended;  // the grant is over: a token that is already stopped
        ended.request_stop();
        return ended.get_token();
      }
      // Made on first request, so a grant nobody watches costs no allocation.
      if (!stop_source) {
        stop_source.emplace();
        if (lost) stop_source->request_stop();
      }
      return stop_source->get_token();
    }

    Result<void> heartbeat_grant(std::uint64_t which) {
      detail::LightLock lock(mutex);
      if (!held || which != generation)
        return fail(Errc::lock_not_held, context() + " is not held through this object");
      if (lost) return fail(Errc::lock_not_held, context() + ": " + lost_reason.message());
      if (auto beat = beat_once(); !beat) return beat;
      return {};
    }

    Result<void> release_grant(std::uint64_t which) {
      detail::LightLock lock(mutex);
      if (!held || which != generation) return fail(Errc::lock_not_held, context() + " grant already ended");
      // A pending heartbeat wake-up stays: it finds nothing held and ends,
      // and keeps acquire/release cycles free of executor work.
      held = false;
      const bool was_lost = std::exchange(lost, false);
      ++generation;  // the guard's grant is over: its lost()/stop_token() no longer apply
      stop_source.reset();
      const HolderKey key = holder_key();
      Result<void> deleted = backend.release(key);
      // Transient failures are retried; other errors end it.
      for (int attempt = 1; !deleted && attempt < release_attempts; ++attempt) {
        if (deleted.error() != Errc::backend_unavailable && deleted.error() != Errc::outcome_unknown) break;
        deleted = backend.release(key);
        if (!deleted && deleted.error() == Errc::lock_not_held) {
          // A retry after an unknown outcome finds the row gone: the first delete landed.
          deleted = {};
          break;
        }
      }
      if (deleted) [[likely]] {
        call_released(metrics, options.lock_name, options.instance_id);
        return {};
      }
      if (was_lost && deleted.error() == Errc::lock_not_held)
        return fail(Errc::lock_not_held, context() + " was lost before release: " + lost_reason.message());
      return with_context(std::move(deleted));
    }

   private:
    static constexpr int release_attempts = 3;

    LockRef lock_ref() const noexcept { return LockRef{options.table, options.lock_name}; }
    HolderKey holder_key() const noexcept { return HolderKey{lock_ref(), options.instance_id, fence}; }
    std::string context() const { return "lock '" + options.lock_name + "'"; }

    template <class T>
    Result<T> with_context(Result<T>&& r) const {
      if (!r) r.error().detail = context() + (r.error().detail.empty() ? "" : ": " + r.error().detail);
      return std::move(r);
    }

    // A row our lost-reply acquire created: ours, and with a fence drawn after
    // every fence we saw before sending it. An older row of ours is a grant we
    // already had (and lost): taking it again would hand out its fence twice.
    bool is_our_new_row(std::string_view holder, Fence row_fence) const {
      return holder == options.instance_id && row_fence > highest_fence_seen;
    }

    static duration age(double seconds) {
      return std::chrono::duration_cast<duration>(std::chrono::duration<double>(seconds));
    }

    // Called with `mutex` held. `sent`: when the server last stamped the row
    // for us, on our clock, never later than the server's view.
    Result<guard_type> grant(Fence granted, time_point sent) {
      highest_fence_seen = std::max(highest_fence_seen, granted);
      held = true;
      lost = false;
      fence = granted;
      ++generation;
      heartbeat_failures = 0;
      stop_source.reset();
      last_good_send = sent;
      const time_point now = clock.now();
      next_beat_at = now + next_heartbeat_delay(options.heartbeat_interval, now);
      ensure_wakeup();
      call_acquired(metrics, options.lock_name, options.instance_id, fence);
      return guard_type(this, generation, fence);
    }

    // Called with `mutex` held.
    Result<guard_type> contended(std::string holder, Fence holder_fence, double age_s) {
      if (!unknown_acquire_pending) highest_fence_seen = std::max(highest_fence_seen, holder_fence);
      call_contended(metrics, options.lock_name, options.instance_id);
      if (age_s >= std::chrono::duration<double>(options.alert_threshold).count() &&
          !(alerted_fence == holder_fence && alerted_holder == holder)) {
        alerted_holder = holder;
        alerted_fence = holder_fence;
        call_alert(metrics, options.lock_name, holder, age_s);
      }
      return guard_type(Errc::lock_held, HolderInfo{std::move(holder), holder_fence, age_s});
    }

    // An acquire whose reply was lost: read the row back rather than guess.
    // std::nullopt: nothing landed and nobody holds the lock (try again).
    std::optional<Result<guard_type>> resolve_unknown_acquire(time_point sent) {
      auto row = backend.inspect(lock_ref());
      if (!row) {
        // Still unknown: if our row did land, the next try finds it and adopts it.
        unknown_acquire_pending = true;
        return fail(Errc::outcome_unknown, context() + ": acquire reply lost and read-back failed: " +
                                               row.error().message());
      }
      if (*row && is_our_new_row((*row)->instance_id, (*row)->fence))
        return grant((*row)->fence, sent - age((*row)->seconds_since_heartbeat));
      if (*row) return contended((*row)->instance_id, (*row)->fence, (*row)->seconds_since_heartbeat);
      return std::nullopt;
    }

    // Heartbeats run on wake-ups: executor tasks that, when due, beat if the
    // lock is held and its beat is due. A wake-up is never cancelled while
    // the mutex lives (cancel may wait for a running task that waits for our
    // lock); one that is no longer needed finds nothing to do and ends.

    // Called with `mutex` held: makes sure a wake-up comes by next_beat_at.
    void ensure_wakeup() {
      if (closing) return;
      for (const Wakeup& w : wakeups)
        if (w.due <= next_beat_at) return;
      const std::uint64_t id = ++last_wakeup;
      const auto delay = std::max(duration::zero(), std::chrono::duration_cast<duration>(next_beat_at - clock.now()));
      wakeups.push_back(Wakeup{id, 0, next_beat_at});
      wakeups.back().task = executor.schedule_after(delay, [this, id] { on_wakeup(id); });
    }

    void on_wakeup(std::uint64_t id) {
      detail::LightLock lock(mutex);
      std::erase_if(wakeups, [id](const Wakeup& w) { return w.id == id; });
      if (closing || !held || lost) return;
      if (clock.now() < next_beat_at) {
        ensure_wakeup();  // a wake-up left from an earlier grant: come back when this one's beat is due
        return;
      }
      const auto beat = beat_once();
      if (lost) return;
      // Next: the regular cadence after success, a quick retry after a failure,
      // and never later than the watchdog's deadline.
      duration next = options.heartbeat_interval;
      if (!beat) {
        const auto backoff = retry_base * (1 << std::min(heartbeat_failures - 1, 6));
        next = std::min(next, duration(backoff));
      }
      const time_point now = clock.now();
      next_beat_at = now + next_heartbeat_delay(next, now);
      ensure_wakeup();
    }

    // The wanted delay from `now`, but never past the watchdog's deadline.
    duration next_heartbeat_delay(duration wanted, time_point now) const {
      const auto until_deadline = std::chrono::duration_cast<duration>(last_good_send + options.lease() - now);
      return std::clamp(until_deadline, duration::zero(), wanted);
    }

    // One heartbeat, with `mutex` held: the watchdog check, the statement, and
    // what its answer means for the lease.
    Result<void> beat_once() {
      const time_point sent = clock.now();
      if (sent - last_good_send >= options.lease()) {
        declare_lost(Error(Errc::lease_lost, "no successful heartbeat for " + seconds(sent - last_good_send) +
                                                 " (lease " + seconds(options.lease()) + ")"));
        return fail(Errc::lock_not_held, context() + ": " + lost_reason.message());
      }
      auto beat = backend.heartbeat(holder_key());
      if (beat) {
        last_good_send = sent;
        heartbeat_failures = 0;
        call_heartbeat_latency(metrics, options.lock_name, options.instance_id,
                               std::chrono::duration<double>(clock.now() - sent).count());
        return {};
      }
      if (beat.error() == Errc::lock_not_held) {
        declare_lost(Error(Errc::lease_lost, "row gone or granted to another holder: " + beat.error().detail));
        return fail(Errc::lock_not_held, context() + ": " + lost_reason.message());
      }
      // Transient: retried, never taken as loss by itself; the watchdog decides.
      ++heartbeat_failures;
      call_heartbeat_failed(metrics, options.lock_name, options.instance_id, beat.error());
      if (clock.now() - last_good_send >= options.lease())
        declare_lost(Error(Errc::lease_lost, "no successful heartbeat within the lease of " + seconds(options.lease()) +
                                                 "; last error: " + beat.error().message()));
      return with_context(std::move(beat));
    }

    void declare_lost(Error reason) {
      lost = true;
      lost_generation = generation;
      lost_reason = std::move(reason);
      if (stop_source) stop_source->request_stop();
      call_lost(metrics, options.lock_name, options.instance_id, lost_reason);
    }

    static std::string seconds(auto d) {
      std::array<char, 32> text{};
      std::snprintf(text.data(), text.size(), "%.1fs", std::chrono::duration<double>(d).count());
      return text.data();
    }

    static constexpr std::chrono::milliseconds retry_base{100};

    mutable detail::LightMutex mutex;  // serializes every backend call: a connection is never shared by two threads
    bool held = false;
    bool lost = false;
    bool unknown_acquire_pending = false;
    Fence fence = 0;
    std::uint64_t generation = 0;  // bumped per grant and per release: stale guards and tasks see a mismatch
    std::uint64_t lost_generation = 0;  // the last grant that was lost
    time_point last_good_send{};   // send time of the last heartbeat (or acquire) the server accepted
    struct Wakeup {
      std::uint64_t id;
      TaskId task;
      time_point due;
    };
    std::vector<Wakeup> wakeups;  // pending heartbeat wake-ups: one, but for a moment after a re-grant
    std::uint64_t last_wakeup = 0;
    time_point next_beat_at{};
    bool closing = false;
    int heartbeat_failures = 0;
    std::optional<std::stop_source> stop_source;
    Error lost_reason;
    std::string alerted_holder;  // alert once per holder and fence
    Fence alerted_fence = -1;
    Fence highest_fence_seen = 0;  // granted to us or seen held, before any acquire in doubt
  };

  std::unique_ptr<State> state_;
};

}  // namespace pgmutex
