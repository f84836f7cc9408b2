// The wait loop while the command runs: forwards signals, reaps the child,
// and when the lease is lost stops the command (SIGTERM, SIGKILL after grace).
#pragma once

#include <chrono>
#include <functional>

#include "child_process.hpp"
#include "signals.hpp"

namespace pgmutex::cli {

struct SupervisionResult {
  int exit_code = 0;            // the child's, as a shell reports it
  bool lease_lost = false;      // the lost wakeup fired while the child ran
  bool killed_after_grace = false;
};

// Blocks in poll() until the child ends; wakes only for a signal, a lost
// lease, or the grace deadline. `on_lost` runs once, before SIGTERM is sent.
SupervisionResult supervise(ChildProcess& child, SignalReader& signals, const Wakeup& lost,
                            std::chrono::nanoseconds grace, const std::function<void()>& on_lost);

}  // namespace pgmutex::cli
