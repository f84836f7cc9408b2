// The I/O threads behind ThreadExecutor::post: private to the core library.
#pragma once

#include "pgmutex/executor.hpp"

namespace pgmutex::detail {

// Runs each posted task on an idle thread, or on a new one if none is idle:
// a task that blocks (a hung statement) never delays another. A thread that
// idles for a while ends, so a quiet process keeps no threads.
//
// All or nothing: if it throws (no memory to queue the task), the task was
// not queued and never runs; if it returns, the task runs exactly once. A
// thread that cannot be created (std::system_error, no memory) is no error:
// the task stays queued, and runs on the next thread that is free, or on a
// thread that the timer thread retries to create soon after.
void post_to_io_pool(Task task);

namespace testing {

// While set, every creation of an I/O thread fails as if the system had no
// threads left. For tests only; read only when a thread is about to be created.
void fail_thread_creation(bool fail) noexcept;

}  // namespace testing
}  // namespace pgmutex::detail
