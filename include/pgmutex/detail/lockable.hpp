// The standard Lockable requirements (lock, try_lock, unlock) on top of a
// mutex's acquire, written once for BasicMutex and AnyMutex. The grant that
// lock()/try_lock() take lives in a guard the mutex keeps (`slot`), since the
// standard interface has nowhere else to put it. Not part of the API.
#pragma once

#include <string>
#include <utility>

#include "pgmutex/error.hpp"

namespace pgmutex::detail {

// A grant still kept, even a lost one, must be unlocked first: taking another
// would drop it silently, and locking twice is a bug std::mutex does not
// forgive either.
template <class Mutex, class Guard>
Result<void> check_slot_free(const Mutex& mutex, const Guard& slot) {
  if (!slot.owns_lock()) return {};
  return fail(Errc::already_acquired, "lock '" + std::string(mutex.lock_name()) + "' is already locked through lock()/try_lock() (fence " +
                                          std::to_string(slot.fence()) + "); unlock() it first");
}

// acquire() with no timeout and no stop token: it returns only once the lock
// is granted, or with an error that retrying would not fix.
template <class Mutex, class Guard>
Result<void> lock_into(Mutex& mutex, Guard& slot) {
  if (auto free = check_slot_free(mutex, slot); !free) return free;
  auto guard = mutex.acquire(nothrow);
  if (!guard) return tl::unexpected(std::move(guard.error()));
  // Without a timeout or a stop token an empty guard cannot come back; say why if it ever does.
  if (!*guard) return fail(guard->why(), "lock '" + std::string(mutex.lock_name()) + "': acquire returned no grant");
  slot = std::move(*guard);
  return {};
}

// One try: false when another instance holds the lock.
template <class Mutex, class Guard>
Result<bool> try_lock_into(Mutex& mutex, Guard& slot) {
  if (auto free = check_slot_free(mutex, slot); !free) return tl::unexpected(std::move(free.error()));
  auto guard = mutex.try_acquire(nothrow);
  if (!guard) return tl::unexpected(std::move(guard.error()));
  if (!*guard) return false;
  slot = std::move(*guard);
  return true;
}

// The slot is emptied before the release goes out, so that once the release
// lets another thread lock this mutex again, nothing here touches the slot.
template <class Mutex, class Guard>
Result<void> unlock_from(const Mutex& mutex, Guard& slot) {
  if (!slot.owns_lock())
    return fail(Errc::lock_not_held, "lock '" + std::string(mutex.lock_name()) + "' is not locked through lock()/try_lock()");
  Guard taken = std::move(slot);
  return taken.release(nothrow);
}

// unlock() without nothrow throws only when nothing was locked: it runs in the
// destructors of std::unique_lock and std::scoped_lock, where a throw ends the
// program, so a failed release (the lease was lost, the backend is down) is
// dropped there as the guard's destructor drops it. unlock(nothrow) returns it.
template <class Mutex, class Guard>
void unlock_or_throw_if_not_locked(const Mutex& mutex, Guard& slot) {
  if (!slot.owns_lock()) value_or_throw(unlock_from(mutex, slot));
  (void)unlock_from(mutex, slot);
}

}  // namespace pgmutex::detail
