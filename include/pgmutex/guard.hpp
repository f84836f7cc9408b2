// The RAII guard a mutex's acquire returns. It converts to true when the lock
// was granted, releases the grant when it goes out of scope, and tells when
// the lease was lost (lost(), and a stop_token that is stopped then).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>

#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#define PGMUTEX_HAS_SINGLE_THREADED 1
#else
#define PGMUTEX_HAS_SINGLE_THREADED 0
#endif

#include "pgmutex/backend.hpp"
#include "pgmutex/error.hpp"

// For the few small functions on every lock operation's path, which a
// compiler left to itself may call out of line in a large translation unit.
#if defined(__GNUC__) || defined(__clang__)
#define PGMUTEX_ALWAYS_INLINE [[gnu::always_inline]] inline
#define PGMUTEX_NOINLINE [[gnu::noinline]]
#else
#define PGMUTEX_ALWAYS_INLINE inline
#define PGMUTEX_NOINLINE
#endif

namespace pgmutex {

namespace detail {

// The mutex of BasicMutex's state and of MemoryServer, as cheap as the
// platform allows. In a process that has only ever had one thread (glibc's __libc_single_threaded,
// which stays false once a second thread was created) it takes and leaves the
// lock with plain stores, as glibc's own pthread mutex does; otherwise with one
// compare-exchange and one exchange, without a call. A contended lock yields
// a few times, then sleeps on the futex (std::atomic::wait) until the holder
// leaves, so a holder that blocks (a backend round trip) costs waiters no CPU.
// State: 0 free, 1 held, 2 held and a thread may be waiting.
// (It lives here because guard.hpp is the header both use; it would rather
// have its own, pgmutex/detail/light_mutex.hpp.)
class LightMutex {
 public:
  PGMUTEX_ALWAYS_INLINE void lock() noexcept {
    if (single_threaded() && state_.load(std::memory_order_relaxed) == 0) {
      state_.store(1, std::memory_order_relaxed);
      return;
    }
    int expected = 0;
    if (!state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) [[unlikely]]
      lock_contended();
  }
  PGMUTEX_ALWAYS_INLINE void unlock() noexcept {
    if (single_threaded()) {  // then nobody can be waiting
      state_.store(0, std::memory_order_relaxed);
      return;
    }
    if (state_.exchange(0, std::memory_order_release) == 2) [[unlikely]]
      state_.notify_one();
  }

 private:
  PGMUTEX_ALWAYS_INLINE static bool single_threaded() noexcept {
#if PGMUTEX_HAS_SINGLE_THREADED
    return __libc_single_threaded != 0;
#else
    return false;
#endif
  }

  PGMUTEX_NOINLINE void lock_contended() noexcept {
    for (int spin = 0; spin < 100; ++spin) {
      int expected = 0;
      if (state_.load(std::memory_order_relaxed) == 0 &&
          state_.compare_exchange_weak(expected, 1, std::memory_order_acquire))
        return;
      std::this_thread::yield();
    }
    // Marked as maybe waited for until whoever takes it next leaves: that
    // unlock wakes one sleeper.
    while (state_.exchange(2, std::memory_order_acquire) != 0) state_.wait(2, std::memory_order_relaxed);
  }

  std::atomic<int> state_{0};
};

// std::lock_guard for a LightMutex, but inlined for sure.
class [[nodiscard]] LightLock {
 public:
  PGMUTEX_ALWAYS_INLINE explicit LightLock(LightMutex& mutex) noexcept : mutex_(mutex) { mutex_.lock(); }
  PGMUTEX_ALWAYS_INLINE ~LightLock() { mutex_.unlock(); }
  LightLock(const LightLock&) = delete;
  LightLock& operator=(const LightLock&) = delete;

 private:
  LightMutex& mutex_;
};

}  // namespace detail

// Who held the lock when an acquire did not get it.
struct HolderInfo {
  std::string instance_id;
  Fence fence = 0;
  double seconds_since_heartbeat = 0.0;
};

template <class State>
class BasicGuard {
 public:
  BasicGuard() = default;
  BasicGuard(BasicGuard&& other) noexcept
      : state_(std::exchange(other.state_, nullptr)),
        generation_(other.generation_),
        fence_(other.fence_),
        why_(other.why_),
        holder_(std::move(other.holder_)) {}
  BasicGuard& operator=(BasicGuard&& other) noexcept {
    if (this != &other) {
      reset();
      state_ = std::exchange(other.state_, nullptr);
      generation_ = other.generation_;
      fence_ = other.fence_;
      why_ = other.why_;
      holder_ = std::move(other.holder_);
    }
    return *this;
  }
  BasicGuard(const BasicGuard&) = delete;
  BasicGuard& operator=(const BasicGuard&) = delete;
  ~BasicGuard() { reset(); }

  // True while this guard owns its grant: acquired and not yet released.
  // A lost lease still owns its grant until released: check lost().
  explicit operator bool() const noexcept { return state_ != nullptr; }
  [[nodiscard]] bool owns_lock() const noexcept { return state_ != nullptr; }

  // The fencing token of this grant: strictly increasing per lock. Pass it to
  // the resource you protect and have it reject lower ones.
  [[nodiscard]] Fence fence() const noexcept { return fence_; }

  // True once the lease is lost (watchdog expired, or the row was taken over).
  [[nodiscard]] bool lost() const { return state_ != nullptr && state_->grant_lost(generation_); }

  // Stopped when the lease is lost. Long work polls it, or registers a std::stop_callback.
  [[nodiscard]] std::stop_token stop_token() const {
    return state_ != nullptr ? state_->grant_stop_token(generation_) : std::stop_token{};
  }

  // Why this guard is empty: Errc::lock_held, Errc::timeout or Errc::cancelled.
  [[nodiscard]] Errc why() const noexcept { return why_; }
  // Who held the lock at the last try, when this guard is empty because of them.
  [[nodiscard]] const std::optional<HolderInfo>& holder() const noexcept { return holder_; }

  // A heartbeat now, besides the automatic ones. Errc::lock_not_held once lost.
  Result<void> heartbeat(nothrow_t) {
    if (state_ == nullptr) return fail(Errc::lock_not_held, "guard does not own a lock");
    return state_->heartbeat_grant(generation_);
  }
  void heartbeat() { value_or_throw(heartbeat(nothrow)); }

  // Release now. Errc::lock_not_held if the row was no longer ours (lease lost).
  Result<void> release(nothrow_t) {
    if (state_ == nullptr) return fail(Errc::lock_not_held, "guard does not own a lock");
    return std::exchange(state_, nullptr)->release_grant(generation_);
  }
  void release() { value_or_throw(release(nothrow)); }

 private:
  friend State;

  BasicGuard(State* state, std::uint64_t generation, Fence fence) noexcept
      : state_(state), generation_(generation), fence_(fence) {}
  BasicGuard(Errc why, std::optional<HolderInfo> holder) noexcept : why_(why), holder_(std::move(holder)) {}

  void reset() noexcept {
    if (state_ != nullptr) (void)std::exchange(state_, nullptr)->release_grant(generation_);
  }

  State* state_ = nullptr;
  std::uint64_t generation_ = 0;
  Fence fence_ = 0;
  Errc why_ = Errc::lock_held;
  std::optional<HolderInfo> holder_;
};

}  // namespace pgmutex
