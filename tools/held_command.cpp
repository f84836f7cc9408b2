// What `run` and `elect` share while a lease is held: the command supervised
// under it (held_command.hpp).
#include "held_command.hpp"

#include <algorithm>
#include <mutex>
#include <cstdio>
#include <optional>
#include <stdexcept>

#include "exit_codes.hpp"
#include "guardian.hpp"
#include "process_group.hpp"
#include "supervisor.hpp"
#include "terminal_text.hpp"

namespace pgmutex::cli {
namespace {

// The command as `status` shows it: its words joined, cut to a readable length
// (never inside a UTF-8 character).
std::string command_text(const std::vector<std::string>& command) {
  constexpr std::size_t max_bytes = 200;
  std::string text;
  for (std::string word : command) {
    // The column is text in the database's encoding: a word that is not
    // UTF-8 (a Latin-1 file name) would make the acquire itself fail.
    if (!utf8_length(word))
      for (char& c : word)
        if (static_cast<unsigned char>(c) >= 0x80) c = '?';
    text += (text.empty() ? "" : " ") + word;
  }
  if (text.size() <= max_bytes) return text;
  std::size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "...";
}

void warn_if_failed(const Holding& holding, const Result<void>& let_go, bool quiet) {
  if (!let_go && !quiet)
    std::fprintf(stderr, "pgmutex: warning: %s failed: %s\n", holding.let_go_failed.c_str(),
                 one_line(let_go.error().message()).c_str());
}

}  // namespace

std::string seconds_text(double seconds) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f s", seconds);
  return buffer;
}

void add_lease_options(CLI::App& command, HoldArgs& args) {
  args.heartbeat_s = to_seconds(Options{}.heartbeat_interval);
  add_threshold_options(command, args.thresholds);
  const FlagText heartbeat = flag_of(&Options::heartbeat_interval);
  command.add_option(heartbeat.name, args.heartbeat_s, heartbeat.help)
      ->capture_default_str()
      ->type_name("S")
      ->check(seconds_validator());
  const FlagText handoff = flag_of(&Options::handoff_deadline);
  command.add_option(handoff.name, args.handoff_s, handoff.help + " (default min(2, the lease))")
      ->type_name("S")
      ->check(seconds_validator());
  command.add_option("--grace", args.grace_s,
                     "seconds between SIGTERM and SIGKILL to the command's process group, if the lock is lost or the "
                     "command leaves processes behind")
      ->capture_default_str()
      ->type_name("S")
      ->check(seconds_validator());
}

// The command must be gone before anyone may reclaim the lock: the safety
// margin covers --grace where the thresholds leave room (safety_margin.hpp).
RunMargin lock_options(const HoldArgs& args) {
  Options options;
  options.lock_name = args.lock;
  options.instance_id = args.instance_id;  // empty: the library's <hostname>-<random>
  options.table = args.connection.table;
  options.heartbeat_interval = to_duration(args.heartbeat_s);
  options.alert_threshold = to_duration(args.thresholds.alert_s);
  options.stale_threshold = to_duration(args.thresholds.stale_s);
  if (args.handoff_s > 0) options.handoff_deadline = to_duration(args.handoff_s);
  return plan_margin(std::move(options), to_duration(args.grace_s));
}

void check_lock_options(const HoldArgs& args, const std::string& what) {
  if (auto valid = validate(lock_options(args).options, run_backend_traits); !valid) {
    const std::string& rule = valid.error().detail;
    const bool margin = rule.find(flag_of(&Options::safety_margin).option) != std::string::npos;
    throw Exit(exit_code::usage, what + ": " + in_flag_terms(rule) +
                                     (margin ? " (raise --stale-threshold or lower --heartbeat-interval)" : ""));
  }
}

Verbosity verbosity_of(const HoldArgs& args) noexcept {
  if (args.quiet) return Verbosity::quiet;
  return args.verbose ? Verbosity::verbose : Verbosity::normal;
}

PostgresOptions held_network(const RunMargin& plan, const std::vector<std::string>& command) {
  // (The backend rounds socket timeouts below 1 s up to 1 s.)
  const auto attempt = validate(plan.options, run_backend_traits).value().heartbeat_timeout;
  PostgresOptions network;
  network.network_timeout = std::clamp<std::chrono::nanoseconds>(attempt, std::chrono::seconds(1), std::chrono::seconds(10));
  network.connect_timeout = network.network_timeout;
  network.reconnect_attempts = 1;
  network.holder_command = command_text(command);
  // One hold, one release: the handoff's statements planned while waiting, and kept.
  network.generic_plans_for_handoff = true;
  // The guard process stops the command ahead of the lease's end by its
  // lead (the grace included): longer than an offer's whole deadline by
  // default, so a provisional grant (its end at the offer's deadline) would
  // stop the command as it starts. The confirm waits for its flush.
  network.unflushed_confirm_window = std::nullopt;
  return network;
}

int hold_for_caller(Holding& holding, SignalReader& signals, RunMetricsFile& report, bool quiet, HoldInput input) {
  Wakeup lost;
  std::stop_callback on_stop(holding.lost_token, [&lost] { lost.notify(); });
  if (hold_until_let_go(signals, lost, input).end == HoldEnd::lost || holding.lost()) {
    report.lost();
    (void)holding.let_go();  // the row is gone or someone else's
    throw Exit(exit_code::lost, holding.what + " was lost while it was held");
  }
  warn_if_failed(holding, holding.let_go(), quiet);
  return 0;
}

namespace {

void fork_child(std::optional<ChildProcess>& child, const SupervisedCommand& command) {
  child.reset();
  // What the command leaves behind becomes our child, so that we can reap it
  // and see its group empty before the lock goes.
  become_subreaper();
  child.emplace(command.argv, command.environment, !in_terminal_foreground());
}

void fork_guard(std::optional<Guardian>& guardian, const SupervisedCommand& command) {
  guardian.reset();
  guardian.emplace(shown(command.lock), command.grace);
}

}  // namespace

// How long the guard keeps a handed-over connection open: a handoff's
// confirm takes a few ms on a quiet machine, and the server session's end
// should come after it. An idle server session lingers this long.
constexpr auto server_session_linger = std::chrono::milliseconds(50);

// Shared with the backend's hand_over_at_close, which may run after
// ForkedAhead is gone (a backend destroyed on another thread): then it is closed.
struct ForkedAhead::HandOver {
  std::mutex mutex;
  Guardian* guardian = nullptr;  // set while the hand over is open
};

ForkedAhead::ForkedAhead(const SupervisedCommand& command, bool waits) : hand_over_(std::make_shared<HandOver>()) {
  if (!waits || command.argv.empty()) return;
  fork_child(child, command);
  fork_guard(guardian, command);
}

ForkedAhead::~ForkedAhead() {
  const std::lock_guard lock(hand_over_->mutex);
  hand_over_->guardian = nullptr;
}

std::function<bool(int socket)> ForkedAhead::connection_hand_over() const {
  return [hand_over = hand_over_](int socket) {
    const std::lock_guard lock(hand_over->mutex);
    return hand_over->guardian != nullptr && hand_over->guardian->hand_over(socket, server_session_linger);
  };
}

void ForkedAhead::open_hand_over() noexcept {
  const std::lock_guard lock(hand_over_->mutex);
  if (guardian && guardian->disarmed()) hand_over_->guardian = &*guardian;
}

int run_supervised(Holding& holding, const SupervisedCommand& command, LeaseWatch& lease_watch, SignalReader& signals,
                   RunMetricsFile& report, ForkedAhead& ahead, InterruptWatch& interrupts) {
  Wakeup lost;
  std::stop_callback on_stop(holding.lost_token, [&lost] { lost.notify(); });

  // Not forked ahead (a try), or forked ahead and killed while we waited
  // (the child by a pkill that matched its argv, or the guard): forked now.
  if (!ahead.child || !ahead.child->waiting_at_gate()) fork_child(ahead.child, command);
  ChildProcess& child = *ahead.child;
  std::optional<Guardian>& guardian = ahead.guardian;
  // The guard enforces the lease too: if pgmutex is stopped (SIGSTOP, or not
  // scheduled), no renewal reaches it, and it stops the command in time.
  std::optional<GuardedLease> guarded;
  if (const auto deadline = lease_watch.deadline()) guarded = GuardedLease{*deadline, command.guard_lead};
  // Armed before the command passes its gate.
  if (!guardian || !guardian->arm(child.kill_target(), guarded)) {
    fork_guard(guardian, command);
    if (!guardian->arm(child.kill_target(), guarded))
      throw std::runtime_error("the guard process ended before it could be armed");
  }
  const LeaseWatchAttachment renewals(lease_watch, *guardian);
  child.set_guard(guardian->pid());
  try {
    child.start(command.late_values);
  } catch (...) {
    guardian->disarm();  // nothing runs: the child never exec'd and is reaped
    throw;
  }
  // Before the supervisor reads signals: one that the wait's thread read
  // after the grant is raised again, and forwarded to the command.
  interrupts.finish();

  const std::string grace = seconds_text(std::chrono::duration<double>(command.grace).count());
  bool lease_lost = false;
  SupervisionEvents events;
  events.lease_lost = [&] {
    lease_lost = true;
    // We stop the command ourselves now (SIGKILL after --grace): the guard
    // steps in only if we cannot, a moment after our SIGKILL was due.
    lease_watch.detach();
    guardian->renew(std::chrono::steady_clock::now() + command.grace + command.guard_lead + std::chrono::milliseconds(100));
    std::fprintf(stderr, "pgmutex: %s was lost (%s); stopping the command: SIGTERM now, SIGKILL after %s\n",
                 holding.what.c_str(), holding.loss_cause().c_str(), grace.c_str());
  };
  events.leftovers = [&](const std::vector<pid_t>& pids) {
    if (command.quiet) return;  // the lock waits for them: nothing the exit code shows
    std::fprintf(stderr,
                 "pgmutex: the command exited but left %zu process%s behind (%s): SIGTERM now, SIGKILL after %s; "
                 "%s is released once they are gone\n",
                 pids.size(), pids.size() == 1 ? "" : "es", pid_list(pids).c_str(), grace.c_str(), holding.what.c_str());
  };
  events.killed_after_grace = [&](const std::vector<pid_t>& pids) {
    if (lease_lost || command.quiet) return;  // the exit message says it, or nothing changes the exit code
    std::fprintf(stderr, "pgmutex: killed the command's leftover processes with SIGKILL after the grace period (%s)\n",
                 pid_list(pids).c_str());
  };
  events.guard_stopped = [&] {
    lease_lost = true;
    std::fprintf(stderr,
                 "pgmutex: %s was lost: pgmutex sent no lease renewal in time (it was stopped or starved), so "
                 "its guard process stopped the command: SIGTERM, SIGKILL after %s\n",
                 holding.what.c_str(), grace.c_str());
  };
  events.guardian_died = [&] {
    if (command.quiet) return;
    std::fprintf(stderr,
                 "pgmutex: warning: the guard process (pid %d) ended: if pgmutex dies now, nothing stops the command\n",
                 static_cast<int>(guardian->pid()));
  };
  const auto outcome = supervise(child, *guardian, signals, lost, command.grace, events);
  guardian->disarm();  // nothing of the command runs any more

  // Lost while the command ran, even if the command ended in the same moment:
  // it may have run beside another holder, and the exit code says so.
  if (outcome.lease_lost || holding.lost()) {
    report.lost();
    (void)holding.let_go();  // the row is gone or someone else's: nothing of ours to delete
    throw Exit(exit_code::lost, holding.what + " was lost while the command ran; " +
                                    (outcome.guard_stopped
                                         ? std::string("pgmutex sent no lease renewal in time, and its guard process stopped the command")
                                     : outcome.killed_after_grace
                                         ? "what still ran of the command was killed with SIGKILL after the "
                                           "grace period"
                                         : "the command ended after SIGTERM"));
  }
  // A failed release leaves a row that goes stale: the exit code is the command's.
  const Result<void> let_go = holding.let_go();
  warn_if_failed(holding, let_go, command.quiet);
  // The guard is reaped with `ahead`, after the connection closed: it may
  // take the connection's socket then, to close once the next holder started.
  if (let_go) ahead.open_hand_over();
  return outcome.exit_code;
}

}  // namespace pgmutex::cli
