// The wait loop while the command runs: forwards signals, reaps, and stops
// what must not outlive the lock: the whole process group after a lost lease,
// and whatever the command left running when it exited.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <vector>

#include "child_process.hpp"
#include "guardian.hpp"
#include "signals.hpp"

namespace pgmutex::cli {

struct SupervisionResult {
  int exit_code = 0;            // the child's, as a shell reports it
  bool lease_lost = false;      // the lost wakeup fired while the command ran, or the guard stopped it
  bool guard_stopped = false;   // the guard process stopped the command: no lease renewal came in time
  bool killed_after_grace = false;
};

// What the loop reports, each at most once, for the caller to put into words.
struct SupervisionEvents {
  std::function<void()> lease_lost;                                  // before SIGTERM goes out
  std::function<void(const std::vector<pid_t>&)> leftovers;          // the child exited, these run on: before SIGTERM
  std::function<void(const std::vector<pid_t>&)> killed_after_grace; // these got SIGKILL
  std::function<void()> guardian_died;                               // the guard process ended early
  std::function<void()> guard_stopped;                               // the guard sent SIGTERM for want of a renewal
};

// Blocks in poll() until the child has ended and no process of its group is
// left; wakes for a signal, a lost lease, the guard's report, the grace
// deadline, or (once the child ended and members of its group remain) a short
// poll of the group. After a lost lease, or when the child ends and leaves
// processes behind, the group gets SIGTERM, and SIGKILL after `grace` if any
// of it still runs. When the guard reports that it stopped the command (we
// were stopped or starved past the lease), the lease counts as lost and only
// the SIGKILL is left to do.
SupervisionResult supervise(ChildProcess& child, Guardian& guardian, SignalReader& signals, const Wakeup& lost,
                            std::chrono::nanoseconds grace, const SupervisionEvents& events);

}  // namespace pgmutex::cli
