// What the library keeps per thread, in one place: a scheduler that runs
// several simulated threads on one OS thread (testing::ManualExecutor's
// spawned bodies, fibers) swaps it at each switch, so that each has its own,
// as each thread has. Not part of the API.
#pragma once

#include "pgmutex/detail/light_mutex.hpp"

namespace pgmutex::detail {

class TaskScope;

struct ThreadLocals {
  const TaskScope* task_scope = nullptr;  // whose task runs here (TaskScope::run)
  const void* simulated_thread = nullptr;  // which simulated thread runs here; none: the thread itself
};

PGMUTEX_ALWAYS_INLINE ThreadLocals& thread_locals() noexcept {
  static thread_local constinit ThreadLocals locals;
  return locals;
}

// Who this is, for a lock that refuses its own holder (IoGate): a per-thread
// address, what std::this_thread::get_id() tells without a call, or the
// simulated thread that runs here.
PGMUTEX_ALWAYS_INLINE const void* thread_identity() noexcept {
  ThreadLocals& here = thread_locals();
  return here.simulated_thread != nullptr ? here.simulated_thread : &here;
}

}  // namespace pgmutex::detail
