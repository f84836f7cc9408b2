// The mutex of BasicMutex's state and of MemoryServer's rows. Not part of the
// API. Held for a few instructions on MemoryBackend and for a network round
// trip on Postgres: uncontended it costs what glibc's mutex costs; a waiter
// yields briefly, then sleeps on the futex.
#pragma once

#include <atomic>
#include <thread>

#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#define PGMUTEX_HAS_SINGLE_THREADED 1
#else
#define PGMUTEX_HAS_SINGLE_THREADED 0
#endif

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

// Whether the process has only ever had one thread (glibc's
// __libc_single_threaded): then nobody else can touch what we touch.
PGMUTEX_ALWAYS_INLINE bool process_single_threaded() noexcept {
#if PGMUTEX_HAS_SINGLE_THREADED
  return __libc_single_threaded != 0;
#else
  return false;
#endif
}

// The mutex of BasicMutex's state and of MemoryServer, as cheap as the
// platform allows. In a process that has only ever had one thread (glibc's __libc_single_threaded,
// which stays false once a second thread was created) it takes and leaves the
// lock with plain stores, as glibc's own pthread mutex does; otherwise with one
// compare-exchange and one exchange, without a call. A contended lock yields
// a few times, then sleeps on the futex (std::atomic::wait) until the holder
// leaves, so a holder that blocks (a backend round trip) costs waiters no CPU.
// State: 0 free, 1 held, 2 held and a thread may be waiting.
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
  // Takes it only if nobody holds it; never waits.
  PGMUTEX_ALWAYS_INLINE bool try_lock() noexcept {
    if (single_threaded()) {
      if (state_.load(std::memory_order_relaxed) != 0) return false;
      state_.store(1, std::memory_order_relaxed);
      return true;
    }
    int expected = 0;
    return state_.compare_exchange_strong(expected, 1, std::memory_order_acquire);
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
  PGMUTEX_ALWAYS_INLINE static bool single_threaded() noexcept { return process_single_threaded(); }

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

// A reference count as cheap as LightMutex: plain arithmetic while the process
// has only ever had one thread, atomic read-modify-writes otherwise.
class LightRefCount {
 public:
  explicit LightRefCount(int initial) noexcept : count_(initial) {}
  PGMUTEX_ALWAYS_INLINE void add() noexcept {
    if (single_threaded()) count_.store(count_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    else count_.fetch_add(1, std::memory_order_relaxed);
  }
  // True when this was the last reference.
  [[nodiscard]] PGMUTEX_ALWAYS_INLINE bool drop() noexcept {
    if (single_threaded()) {
      const int left = count_.load(std::memory_order_relaxed) - 1;
      count_.store(left, std::memory_order_relaxed);
      return left == 0;
    }
    return count_.fetch_sub(1, std::memory_order_acq_rel) == 1;
  }

 private:
  PGMUTEX_ALWAYS_INLINE static bool single_threaded() noexcept { return process_single_threaded(); }
  std::atomic<int> count_;
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

}  // namespace pgmutex
