// The lock that serializes one mutex's statements (a backend connection never
// serves two threads at once). Not part of the API.
#pragma once

#include <atomic>

#include "pgmutex/detail/light_mutex.hpp"
#include "pgmutex/detail/thread_locals.hpp"

namespace pgmutex::detail {

// Held across a statement, so nothing that must answer while a statement
// hangs (the grant's book, the lease timer, the guard's accessors) takes it.
// A thread that already holds it is refused instead of deadlocking: that
// happens only where a simulation runs tasks (a stop callback that calls
// release(), say) inside a hung statement, on the statement's own thread.
class IoGate {
 public:
  PGMUTEX_ALWAYS_INLINE bool enter() noexcept {
    const void* me = thread_identity();
    if (owner_.load(std::memory_order_relaxed) == me) [[unlikely]]
      return false;
    mutex_.lock();
    owner_.store(me, std::memory_order_relaxed);
    return true;
  }
  // Enters only if no thread is inside a statement: for a read that must
  // not queue behind a long one (a wait in line holds the gate throughout).
  PGMUTEX_ALWAYS_INLINE bool try_enter() noexcept {
    const void* me = thread_identity();
    if (owner_.load(std::memory_order_relaxed) == me || !mutex_.try_lock()) return false;
    owner_.store(me, std::memory_order_relaxed);
    return true;
  }
  // A hint, stale as soon as read: some thread is inside a statement (or
  // entering one). A backend's I/O thread checks it before running a job that
  // would enter: a thread that holds the gate may be waiting for that very
  // I/O thread to run its statement.
  PGMUTEX_ALWAYS_INLINE bool busy() const noexcept { return owner_.load(std::memory_order_relaxed) != nullptr; }
  PGMUTEX_ALWAYS_INLINE void leave() noexcept {
    owner_.store(nullptr, std::memory_order_relaxed);
    mutex_.unlock();
  }

 private:
  LightMutex mutex_;
  std::atomic<const void*> owner_{nullptr};  // compared only with the reader's own thread_identity()
};

// IoLock's tag: enter only if the gate is free.
struct TryEnter {};

class [[nodiscard]] IoLock {
 public:
  PGMUTEX_ALWAYS_INLINE explicit IoLock(IoGate& gate) noexcept : gate_(gate), entered_(gate.enter()) {}
  // Enters only if the gate is free (IoGate::try_enter).
  PGMUTEX_ALWAYS_INLINE IoLock(IoGate& gate, TryEnter) noexcept : gate_(gate), entered_(gate.try_enter()) {}
  PGMUTEX_ALWAYS_INLINE ~IoLock() {
    if (entered_) gate_.leave();
  }
  IoLock(const IoLock&) = delete;
  IoLock& operator=(const IoLock&) = delete;
  // False: this thread is already inside a statement of the same mutex.
  explicit operator bool() const noexcept { return entered_; }

 private:
  IoGate& gate_;
  bool entered_;
};

}  // namespace pgmutex::detail
