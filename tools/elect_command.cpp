// pgmutex elect: campaign for the leadership of a lock (issue 18), then run a
// command as its leader, or with no command lead until a signal.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "commands.hpp"
#include "connection.hpp"
#include "elect_listen.hpp"
#include "exit_codes.hpp"
#include "held_command.hpp"
#include "interrupt_watch.hpp"
#include "pgmutex/election.hpp"
#include "terminal_text.hpp"

namespace pgmutex::cli {
namespace {

using CliElection = BasicElection<PostgresBackend, SteadyClock, LockEvents>;
using Leadership = CliElection::leadership_type;

struct ElectArgs : HoldArgs {
  std::string value;
  double timeout_s = 0;
  CLI::Option* timeout_option = nullptr;
  std::vector<std::string> command;
  bool listen = false;
  bool json = false;
};

// The value is checked before any statement, by the library's own rule.
void check_usage(const ElectArgs& args, const CLI::Option& value) {
  if (value.count() == 0) throw Exit(exit_code::usage, "elect: --value is required to campaign (or --listen to follow)");
  if (auto valid = validate_election_value(args.lock, args.value); !valid)
    throw Exit(exit_code::usage, "elect: --value: " + one_line(valid.error().detail));
  check_lock_options(args, "elect");
}

// Who leads, for the line of a campaign that gave up: "term 7, value '...', instance web-1".
std::string leader_text(CliElection& election) {
  auto leader = election.leader(nothrow);
  if (!leader || !*leader) return "";
  return " (the leader: term " + std::to_string((*leader)->term) + ", value '" + shown((*leader)->value) +
         "', instance " + shown((*leader)->instance_id) + ")";
}

using WaitDeadline = std::optional<std::chrono::steady_clock::time_point>;

Leadership campaign(CliElection& election, const ElectArgs& args, WaitDeadline deadline, InterruptWatch& interrupts) {
  interrupts.start_waiting();
  std::optional<std::chrono::nanoseconds> left;
  if (deadline)
    left = std::max(std::chrono::nanoseconds::zero(), std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                          *deadline - std::chrono::steady_clock::now()));
  auto leadership = election.campaign(nothrow, args.value, left, interrupts.stop_token());
  // Joined once the command runs (run_supervised), unless we end here.
  const int signo = interrupts.stop_at_grant();
  if (!leadership || !*leadership || signo != 0) interrupts.finish();
  if (!leadership) exit_with(leadership.error(), "elect", args.connection);
  if (signo != 0)
    throw Exit(exit_code::signal_base + signo,
               std::string("interrupted by SIG") + signal_name(signo) + " " +
                   (*leadership ? "before leading" : "while campaigning for lock '" + shown(args.lock) + "'"));
  if (!*leadership)
    throw Exit(exit_code::temporary, "lock '" + shown(args.lock) + "': not leading after waiting " +
                                         seconds_text(args.timeout_s) + leader_text(election));
  return std::move(*leadership);
}

// What the shared code holds: the leadership, resigned at the end (vacated, then released).
Holding holding_of(const ElectArgs& args, Leadership& leadership) {
  const std::string lock = "lock '" + shown(args.lock) + "'";
  return Holding{
      .what = "the leadership of " + lock + " (term " + std::to_string(leadership.term()) + ")",
      .lost_token = leadership.stop_token(),
      .lost = [&leadership] { return leadership.lost(); },
      .loss_cause = [] { return std::string("lease lost"); },
      .let_go = [&leadership] { return leadership.resign(nothrow); },
      .let_go_failed = "resigning the leadership of " + lock,
  };
}

int execute(ElectArgs& args, const CLI::Option& value) {
  if (args.listen) {
    if (value.count() > 0 || !args.command.empty())
      throw Exit(exit_code::usage, "elect: --listen follows the election: it takes no --value and no command");
    return listen_for_leaders(ListenArgs{args.connection, args.lock, args.instance_id, args.json});
  }
  if (args.json) throw Exit(exit_code::usage, "elect: --json goes with --listen");
  check_usage(args, value);

  // Before any thread exists, so that every thread inherits the mask.
  block_supervised_signals();
  SignalReader signals;
  SupervisedCommand command{
      .argv = args.command,
      .environment = {.variables = {{"PGMUTEX_LOCK", args.lock}, {"PGMUTEX_VALUE", args.value}},
                      .late = {"PGMUTEX_FENCE", "PGMUTEX_TERM", "PGMUTEX_INSTANCE"}},
      .grace = to_duration(args.grace_s),
      .lock = args.lock,
      .quiet = args.quiet,
  };
  // A campaign may wait: the command's child and its guard, forked now (held_command.hpp).
  ForkedAhead ahead(command, /*waits=*/true);
  RunMetricsFile report("", args.lock, args.instance_id);  // elect writes no metrics file
  InterruptWatch interrupts(signals);

  const RunMargin plan = lock_options(args);
  PostgresOptions network = held_network(plan, args.command);
  network.hand_over_at_close = ahead.connection_hand_over();  // the guard closes it after the next holder's start
  // Outlives the election, whose hooks feed it: the lease deadline the guard enforces.
  LeaseWatch lease_watch;
  // A campaign waits, and so does a server that cannot be reached yet, within the same --timeout.
  const WaitDeadline deadline = args.timeout_option->count() > 0
                                    ? WaitDeadline(std::chrono::steady_clock::now() + to_duration(args.timeout_s))
                                    : std::nullopt;
  CliElection election(connect_backend_waiting(args.connection, network, deadline), plan.options, SteadyClock{},
                       LockEvents{.verbosity = verbosity_of(args), .lease = &lease_watch, .report = &report});
  Leadership leadership = campaign(election, args, deadline, interrupts);

  if (!plan.shortfall.empty() && !args.quiet) std::fprintf(stderr, "pgmutex: warning: %s\n", one_line(plan.shortfall).c_str());

  Holding holding = holding_of(args, leadership);
  const std::string term = std::to_string(leadership.term());
  // No command, as etcdctl elect NAME PROPOSAL: one line, then lead until a signal.
  if (args.command.empty()) {
    std::printf("leading lock '%s': term %s, value '%s'\n", shown(args.lock).c_str(), term.c_str(),
                shown(args.value).c_str());
    std::fflush(stdout);
    interrupts.finish();
    return hold_for_caller(holding, signals, report, args.quiet, HoldInput::ignored);
  }

  command.guard_lead = guard_lead(election.options(), command.grace);
  command.late_values = {term, term, election.options().instance_id};
  return run_supervised(holding, command, lease_watch, signals, report, ahead, interrupts);
}

}  // namespace

CommandRunner add_elect_command(CLI::App& app) {
  auto args = std::make_shared<ElectArgs>();
  CLI::App* elect = app.add_subcommand(
      "elect", "Campaign for the leadership of a lock, then run a command as its leader, or with no command lead until a signal");
  const FlagText lock = flag_of(&Options::lock_name);
  const FlagText instance = flag_of(&Options::instance_id);
  elect->add_option(lock.name, args->lock, "the election's name: " + lock.help)
      ->required()
      ->type_name("NAME")
      ->check(lock_name_validator());
  CLI::Option* value = elect->add_option("--value", args->value,
                    "what the leader announces (its address, say): at most 7168 bytes of UTF-8 with no NUL; "
                    "`pgmutex status` shows it, the command gets it as PGMUTEX_VALUE; required to campaign")
      ->type_name("VALUE");
  elect->add_flag("-l,--listen", args->listen,
                  "do not campaign: print the current leader, then every change (elected, proclaimed, vacated, "
                  "expired), one line each, until SIGINT or SIGTERM (exit 0)");
  elect->add_flag("--json", args->json,
                  "with --listen: each line a JSON object: lock, event, term, change, value, instance, host, since "
                  "(null while nobody leads), gap, missed");
  args->timeout_option = elect->add_option("-w,--timeout", args->timeout_s,
                                           "campaign up to S seconds, then exit 75 (default: wait in line with no end)")
                             ->type_name("S")
                             ->check(seconds_validator());
  add_lease_options(*elect, *args);
  CLI::Option* quiet = elect->add_flag(
      "-q,--quiet", args->quiet,
      "print only what changes the exit code, and a lost leadership: no warning for heartbeats retried after a "
      "restart; errors are still printed");
  elect->add_flag("-v,--verbose", args->verbose,
                  "also print each lock event: acquired (with the fence), released, a heartbeat recovered after retries")
      ->excludes(quiet);
  elect->add_option(instance.name, args->instance_id,
                    instance.help + " and PGMUTEX_INSTANCE gives it (default <hostname>-<random>)")
      ->type_name("ID");
  add_connection_options(*elect, args->connection);
  elect->add_option("COMMAND", args->command,
                    "the command to run as leader, and its arguments: the first word that is not an option of elect, "
                    "or every word after --")
      ->type_name("");
  elect->footer(R"help(Candidates wait in the lock's queue, first come first served. The leader's
term is its grant's fence: strictly increasing across the leaders of a lock.

With a command, the leader runs it exactly as pgmutex run does (process group,
signals forwarded, the guard process, SIGTERM then SIGKILL after --grace if the
lease is lost), with PGMUTEX_TERM (the term), PGMUTEX_VALUE, PGMUTEX_LOCK,
PGMUTEX_FENCE (the term again) and PGMUTEX_INSTANCE in its environment. Once the
command ends, the leader resigns (the next candidate leads with a higher term),
and pgmutex exits with the command's exit code.

With no command (as etcdctl elect NAME PROPOSAL), pgmutex prints one line
saying it leads, with the term and value, and leads until SIGINT or SIGTERM (or
another signal that ends a process), then resigns and exits 0.

With --listen (as etcdctl elect -l NAME), pgmutex never campaigns: it prints
who leads now, then every change in term order as it happens (woken by
NOTIFY: no polling), until SIGINT or SIGTERM, then exits 0. Changes it could
not see (a lost connection) come as one line saying how many were missed.

Exit codes: the command's; 70 if the leadership was lost (its lease lost)
while it led; 75 if --timeout passed before it led; 64 usage, or a value over
7168 bytes, not UTF-8 or with a NUL; 128+N interrupted by signal N while
campaigning; others as pgmutex --help says.

Examples:
  pgmutex elect --lock primary --value 10.0.0.7:5432 -- ./serve-as-primary.sh
  pgmutex elect --lock scheduler --value "$(hostname)" -w 60 -- ./scheduler
  pgmutex elect --lock primary --value 10.0.0.7:5432 &   # lead until killed
  pgmutex elect --lock primary --listen --json            # follow the leader
  pgmutex status primary --json | jq '.leaders[0]'       # who leads, which term)help");
  return [args, value] { return execute(*args, *value); };
}

}  // namespace pgmutex::cli
