// What `run` and `elect` share: the flags of the lease they hold, the options
// and connection made from them, and what happens while it is held: the
// command supervised under it (process group, signals, the guard process,
// a lost lease), or with no command the hold until a signal lets go. `run`
// holds a guard, `elect` a leadership: each hands over a Holding.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "arguments.hpp"
#include "child_process.hpp"
#include "guardian.hpp"
#include "hold.hpp"
#include "interrupt_watch.hpp"
#include "lease_watch.hpp"
#include "lock_events.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/postgres_backend.hpp"
#include "run_report.hpp"
#include "safety_margin.hpp"
#include "signals.hpp"

namespace pgmutex::cli {

// The flags of the held lease, as run and elect take them.
struct HoldArgs {
  ConnectionArgs connection;
  ThresholdArgs thresholds{};
  std::string lock;
  double heartbeat_s = 0;
  double grace_s = 10;
  double handoff_s = 0;  // 0: the library's default
  bool quiet = false;
  bool verbose = false;
  std::string instance_id;
};

// --alert-threshold, --stale-threshold, --heartbeat-interval, --handoff-deadline and --grace.
void add_lease_options(CLI::App& command, HoldArgs& args);

// The library's options for these flags, with the safety margin that covers
// --grace where the thresholds leave room (safety_margin.hpp).
[[nodiscard]] RunMargin lock_options(const HoldArgs& args);
// Throws Exit(usage), the message starting with `what` ("run"), unless the library accepts them.
void check_lock_options(const HoldArgs& args, const std::string& what);
[[nodiscard]] Verbosity verbosity_of(const HoldArgs& args) noexcept;

// The connection's timeouts: a heartbeat stuck in the network must fail
// within one attempt's timeout, which the safety margin covers.
[[nodiscard]] PostgresOptions held_network(const RunMargin& plan, const std::vector<std::string>& command);

// "2.5 s"
[[nodiscard]] std::string seconds_text(double seconds);

// What is held, as the shared code needs it: run's guard, or elect's leadership.
struct Holding {
  std::string what;                         // "lock 'x'": what the messages say was lost or is released
  std::stop_token lost_token;               // stopped once the lease is lost
  std::function<bool()> lost;               // true once the lease is lost
  std::function<std::string()> loss_cause;  // "lease lost", or what a heartbeat says now
  std::function<Result<void>()> let_go;     // release, or resign
  std::string let_go_failed;                // "releasing lock 'x'": the warning when let_go fails
};

struct SupervisedCommand {
  std::vector<std::string> argv;
  EnvironmentOverrides environment;       // its late names get late_values
  std::chrono::nanoseconds grace{};
  std::string lock;  // the name the guard process says it stopped the command for
  bool quiet = false;
  // Known only later: set before run_supervised().
  std::chrono::nanoseconds guard_lead{};  // guard_lead(options, grace), once the options are known
  std::vector<std::string> late_values{};  // once granted: the fence, ...
};

// The command's processes, forked before the wait for the lock if there will
// be a command and the lock may take a while (a try that fails at once needs
// none): the child, held at its gate, and the guard process (guardian.hpp),
// not yet armed. Construct it before any thread and before the connection:
// the forks are cheapest then, the child holds none of our sockets while it
// waits, and neither fork is on the path from the grant to the command.
// If pgmutex ends before the grant, both exit: nothing runs, nothing is killed.
//
// It also lends the guard the lock's connection as pgmutex exits: give
// connection_hand_over() to PostgresOptions::hand_over_at_close, and once
// run_supervised() has let go, the backend's closing hands the connection's
// socket to the guard, which ends it 50 ms later. The server process's end
// (about 15 ms of CPU here) then comes after the next holder's start, not
// between its grant and its confirm. Until this object goes: a backend
// destroyed later (on another thread) closes its connection itself.
class ForkedAhead {
 public:
  ForkedAhead(const SupervisedCommand& command, bool waits);
  ~ForkedAhead();
  ForkedAhead(const ForkedAhead&) = delete;
  ForkedAhead& operator=(const ForkedAhead&) = delete;

  std::optional<ChildProcess> child;
  std::optional<Guardian> guardian;

  [[nodiscard]] std::function<bool(int socket)> connection_hand_over() const;
  // The lock was let go, nothing of the command runs: the connection may go to the guard.
  void open_hand_over() noexcept;

 private:
  struct HandOver;
  std::shared_ptr<HandOver> hand_over_;
};

// Runs the command while `holding` is held, supervised: signals forwarded to
// its process group, its leftovers stopped, the guard process armed with the
// lease deadlines `lease_watch` receives. What `ahead` holds is used, what it
// does not is forked now. The wait's `interrupts` (stopped at the grant) is
// joined once the command started. Lets go once nothing of it runs. Returns
// its exit code; throws Exit(lost) if the lease was lost meanwhile.
int run_supervised(Holding& holding, const SupervisedCommand& command, LeaseWatch& lease_watch, SignalReader& signals,
                   RunMetricsFile& report, ForkedAhead& ahead, InterruptWatch& interrupts);

// No command: holds until a signal (or with HoldInput::watched the end of
// stdin) lets go, then lets go and returns 0; throws Exit(lost) if the lease
// is lost first.
int hold_for_caller(Holding& holding, SignalReader& signals, RunMetricsFile& report, bool quiet, HoldInput input);

}  // namespace pgmutex::cli
