// pgmutex run: hold a lock while a command runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "commands.hpp"
#include "connection.hpp"
#include "exit_codes.hpp"
#include "held_command.hpp"
#include "interrupt_watch.hpp"
#include "pgmutex/basic_mutex.hpp"
#include "status_format.hpp"
#include "terminal_text.hpp"

namespace pgmutex::cli {
namespace {

using RunMutex = BasicMutex<PostgresBackend, SteadyClock, LockEvents>;
using Guard = RunMutex::guard_type;

struct RunArgs : HoldArgs {
  bool wait = false;
  bool no_wait = false;  // -n: the default, spelled as flock spells it
  double timeout_s = 0;
  CLI::Option* timeout_option = nullptr;
  std::vector<std::string> command;
  std::string shell_command;  // -c: run as sh -c, as flock -c
  CLI::Option* shell_option = nullptr;
  int conflict_exit_code = exit_code::temporary;
  std::string metrics_file;
};

void check_usage(RunArgs& args) {
  if (args.timeout_option->count() > 0) args.wait = true;
  if (args.shell_option->count() > 0) {
    if (!args.command.empty())
      throw Exit(exit_code::usage, "run: -c gives the command as one string: give no command after it as well");
    args.command = {"sh", "-c", args.shell_command};
    return check_lock_options(args, "run");
  }
  check_lock_options(args, "run");  // no command: hold the lock (hold_lock)
}

// The one line a contender prints: who holds the lock and how late they are.
// --quiet: none, as flock -n prints none. -E sets the code.
[[noreturn]] void exit_taken(const RunArgs& args, const std::optional<LockRow>& holder, bool timed_out) {
  if (args.quiet) throw Exit(args.conflict_exit_code, "");
  std::string line = "lock '" + shown(args.lock) + "' is ";
  line += timed_out ? "still held after waiting " + seconds_text(args.timeout_s) + " by " : "held by ";
  if (holder) {
    line += shown(holder->instance_id) + " (fence " + std::to_string(holder->fence) + "), last heartbeat " +
            seconds_text(holder->seconds_since_heartbeat) + " ago";
    if (const std::string where = holder_where(*holder); !where.empty()) line += ", " + where;
    if (holder->seconds_since_heartbeat >= args.thresholds.alert_s)
      line += " - past the alert threshold (" + seconds_text(args.thresholds.alert_s) +
              "): the holder may be dead; the lock becomes reclaimable at " + seconds_text(args.thresholds.stale_s);
  } else {
    line += "another instance";
  }
  throw Exit(args.conflict_exit_code, line);
}

// Nobody holds the lock, but the server was promoted after a failover and
// grants nothing that looks free until its grace has passed (README, "Failover").
[[noreturn]] void exit_in_failover_grace(const RunArgs& args, double left_s, bool timed_out) {
  throw Exit(args.conflict_exit_code,
             "lock '" + shown(args.lock) + "' is not granted" +
                 (timed_out ? " after waiting " + seconds_text(args.timeout_s) : std::string()) +
                 ": the server was promoted after a failover and grants no free lock for " + seconds_text(left_s) +
                 " more (its failover grace: a holder whose grant the failover lost may still be running)");
}

[[noreturn]] void exit_interrupted(int signo, const std::string& when) {
  throw Exit(exit_code::signal_base + signo, std::string("interrupted by SIG") + signal_name(signo) + " " + when);
}

// Who holds the lock, read from its row: the row has the holder's pid and
// command, and an acquire that lost a race with a concurrent insert may not
// have seen the winner's row (its snapshot predates it). If the row cannot be
// read, what the acquire saw.
std::optional<LockRow> holder_of(RunMutex& mutex, const Guard& empty) {
  if (auto row = mutex.inspect(nothrow); row && *row) return **row;
  if (!empty.holder() || empty.holder()->instance_id.empty()) return std::nullopt;
  LockRow seen;
  seen.instance_id = empty.holder()->instance_id;
  seen.fence = empty.holder()->fence;
  seen.seconds_since_heartbeat = empty.holder()->seconds_since_heartbeat;
  return seen;
}

// The end of --timeout, counted from the start: connecting is part of the wait.
using WaitDeadline = std::optional<std::chrono::steady_clock::time_point>;

Guard take_lock(RunMutex& mutex, const RunArgs& args, WaitDeadline deadline, InterruptWatch& interrupts,
                RunMetricsFile& report) {
  report.wait_started();
  interrupts.start_waiting();
  const auto left = [&] {
    return std::max(std::chrono::nanoseconds::zero(),
                    std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline - std::chrono::steady_clock::now()));
  };
  auto guard = args.wait ? mutex.acquire(nothrow, deadline ? std::optional(left()) : std::nullopt,
                                         interrupts.stop_token())
                         : mutex.try_acquire(nothrow);
  // Joined once the command runs (run_supervised), unless we end here.
  const int interrupted = interrupts.stop_at_grant();
  if (!guard || !*guard || interrupted != 0) interrupts.finish();
  if (!guard) exit_with(guard.error(), "run", args.connection);
  if (*guard) report.wait_ended(LockOutcome::acquired, guard->fence());
  else if (guard->why() == Errc::lock_held || guard->why() == Errc::timeout) report.wait_ended(LockOutcome::taken);
  else report.wait_ended(LockOutcome::none);  // an interrupt cancelled the wait
  if (interrupted != 0)
    exit_interrupted(interrupted, *guard ? "before the command started" : "while waiting for lock '" + shown(args.lock) + "'");
  if (!*guard && !args.quiet && guard->holder() && guard->holder()->failover_grace_left_s > 0)
    exit_in_failover_grace(args, guard->holder()->failover_grace_left_s, guard->why() == Errc::timeout);
  if (!*guard) exit_taken(args, args.quiet ? std::nullopt : holder_of(mutex, *guard), guard->why() == Errc::timeout);
  return std::move(*guard);
}

// What the shared code holds: the guard, released at the end.
Holding holding_of(const RunArgs& args, Guard& guard) {
  const std::string what = "lock '" + shown(args.lock) + "'";
  return Holding{
      .what = what,
      .lost_token = guard.stop_token(),
      .lost = [&guard] { return guard.lost(); },
      .loss_cause =
          [&guard] {
            const auto why = guard.heartbeat(nothrow);
            return why ? std::string("lease lost") : one_line(why.error().message());
          },
      .let_go = [&guard] { return guard.release(nothrow); },
      .let_go_failed = "releasing " + what,
  };
}

int execute(RunArgs& args, RunMetricsFile& report) {
  check_usage(args);

  // Before any thread exists, so that every thread inherits the mask.
  block_supervised_signals();
  SignalReader signals;
  SupervisedCommand command{
      .argv = args.command,
      .environment = {.variables = {{"PGMUTEX_LOCK", args.lock}}, .late = {"PGMUTEX_FENCE", "PGMUTEX_INSTANCE"}},
      .grace = to_duration(args.grace_s),
      .lock = args.lock,
      .quiet = args.quiet,
  };
  // With --wait: the command's child and its guard, forked now (held_command.hpp).
  ForkedAhead ahead(command, args.wait);
  InterruptWatch interrupts(signals, [&report](int code) { report.write(code); });

  // A heartbeat stuck in the network (its statement, then one reconnect)
  // must fail within one attempt's timeout, which the safety margin covers.
  const RunMargin plan = lock_options(args);
  PostgresOptions network = held_network(plan, args.command);
  network.hand_over_at_close = ahead.connection_hand_over();  // the guard closes it after the next holder's start
  // Outlives the mutex, whose hooks feed it: the lease deadline the guard enforces.
  LeaseWatch lease_watch;
  // With --wait, a server that cannot be reached yet is waited for too (a
  // failover in progress), within the same --timeout.
  const WaitDeadline deadline =
      args.timeout_option->count() > 0 ? WaitDeadline(std::chrono::steady_clock::now() + to_duration(args.timeout_s))
                                       : std::nullopt;
  auto created = RunMutex::create(args.wait ? connect_backend_waiting(args.connection, network, deadline)
                                            : connect_backend(args.connection, network),
                                  plan.options, SteadyClock{},
                                  LockEvents{.report_alerts = args.wait,
                                             .verbosity = verbosity_of(args),
                                             .lease = &lease_watch,
                                             .report = &report});
  if (!created) exit_with(created.error(), "run", args.connection);
  RunMutex& mutex = *created;
  report.set_instance(mutex.instance_id());
  Guard guard = take_lock(mutex, args, deadline, interrupts, report);

  // Only a holder warns: a contender that exits 75 has no command to stop.
  if (!plan.shortfall.empty() && !args.quiet) std::fprintf(stderr, "pgmutex: warning: %s\n", one_line(plan.shortfall).c_str());

  Holding holding = holding_of(args, guard);
  // No command, as etcdctl lock NAME: the fence on stdout, then hold until a
  // signal or the end of stdin lets go (exit 0), or the lease is lost (exit 70).
  if (args.command.empty()) {
    std::printf("%s\n", std::to_string(guard.fence()).c_str());
    std::fflush(stdout);
    interrupts.finish();
    return hold_for_caller(holding, signals, report, args.quiet, HoldInput::watched);
  }

  command.guard_lead = guard_lead(mutex.options(), command.grace);
  command.late_values = {std::to_string(guard.fence()), std::string(mutex.instance_id())};
  return run_supervised(holding, command, lease_watch, signals, report, ahead, interrupts);
}

}  // namespace

CommandRunner add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();

  CLI::App* run = app.add_subcommand("run", "Run a command while holding a lock, or with no command hold it; exit 75 if the lock is taken");
  const FlagText lock = flag_of(&Options::lock_name);
  const FlagText instance = flag_of(&Options::instance_id);
  run->add_option(lock.name, args->lock, lock.help)
      ->required()
      ->type_name("NAME")
      ->check(lock_name_validator());
  CLI::Option* wait = run->add_flag("--wait", args->wait, "wait for the lock (with no end unless -w/--timeout) instead of exiting 75 at once");
  // As flock -w S: a timeout is a wait with an end, so it needs no --wait.
  args->timeout_option = run->add_option("-w,--timeout", args->timeout_s,
                                         "wait for the lock up to S seconds, then exit 75 (as flock -w); implies --wait")
                             ->type_name("S")
                             ->check(seconds_validator());
  // flock's -n: not waiting is already the default; accepted so that the habit works.
  run->add_flag("-n,--no-wait", args->no_wait, "exit 75 at once if the lock is taken (the default; as flock -n)")
      ->excludes(wait)
      ->excludes(args->timeout_option);
  add_lease_options(*run, *args);
  CLI::Option* quiet = run->add_flag(
      "-q,--quiet", args->quiet,
      "print only what changes the exit code, and a lost lock: nothing when the lock is taken (as flock -n), no "
      "warning for heartbeats retried after a restart (--metrics-file counts them); errors are still printed");
  run->add_flag("-v,--verbose", args->verbose,
                "also print each lock event: acquired (with the fence), released, a heartbeat recovered after retries")
      ->excludes(quiet);
  run->add_option("-E,--conflict-exit-code", args->conflict_exit_code,
                  "exit with N instead of 75 when the lock is taken, or still taken after --timeout (as flock -E)")
      ->capture_default_str()
      ->type_name("N")
      ->check(CLI::Range(0, 255));
  run->add_option(instance.name, args->instance_id, instance.help + " and PGMUTEX_INSTANCE gives it (default <hostname>-<random>)")
      ->type_name("ID");
  run->add_option("--metrics-file", args->metrics_file,
                  "when pgmutex exits, however it exits, write the run's metrics (times, exit code, lock wait and "
                  "outcome, fence) to PATH in the Prometheus text format, atomically (for node_exporter's textfile "
                  "collector: PATH ends in .prom)")
      ->type_name("PATH");
  args->shell_option = run->add_option("-c,--command", args->shell_command,
                                       "run STRING with sh -c instead of a command after -- (as flock -c)")
                           ->type_name("STRING");
  add_connection_options(*run, args->connection);
  run->add_option("COMMAND", args->command, "the command and its arguments: the first word that is not an option of run, or every word after --")->type_name("");
  run->footer(R"(The command gets PGMUTEX_LOCK, PGMUTEX_FENCE (strictly increasing per lock: pass it
to what you protect) and PGMUTEX_INSTANCE in its environment. Every signal pgmutex
can catch (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, ...) is forwarded to
its process group. The lock is released only once no process of that group runs:
leftovers get SIGTERM, then SIGKILL after --grace. If pgmutex itself dies, a guard
process kills the group. pgmutex exits with the command's exit code (128+N if
signal N killed it); 75 (or -E N) if the lock is taken; 70 if the lock was lost
while it ran. Other failures: 64 usage or DSN, 69 unreachable, 77 permission,
78 table missing (see pgmutex --help).

The command is every word after --, or without -- the first word that is not
an option of run and every word after it (options included); -c STRING runs
sh -c STRING instead, as flock -c.

With no command (as etcdctl lock NAME), pgmutex holds the lock for whoever
started it: it prints the fence on stdout, holds the lock until SIGINT, SIGTERM
(or another signal that ends a process) or until stdin closes, then releases it
and exits 0; 70 if the lock is lost meanwhile.

Examples:
  pgmutex run --lock nightly-report -- ./report.sh
  pgmutex run --lock deploy -w 300 make deploy       # wait up to 300 s, as flock -w
  pgmutex run --lock backup -c 'pg_dump app | gzip > /backup/app.gz'
  coproc pgmutex run --lock maintenance; read -r fence <&"${COPROC[0]}"  # hold it in a shell
  */5 * * * *  pgmutex run --lock sync --quiet -E 0 --dsn 'host=db user=cron' -- /opt/sync)");
  return [args] {
    // Every way out writes the report: the command's code, 75, 70, an
    // interrupt (128+N), a usage or connection error, an internal error.
    RunMetricsFile report(args->metrics_file, args->lock, args->instance_id);
    try {
      const int code = execute(*args, report);
      report.write(code);
      return code;
    } catch (const Exit& exit) {
      report.write(exit.code());
      throw;
    } catch (...) {
      report.write(exit_code::internal);
      throw;
    }
  };
}

}  // namespace pgmutex::cli
