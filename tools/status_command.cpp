// pgmutex status [NAME] [--json | --format text|json|prometheus | --check]: who holds what, and how late their heartbeats are.
#include <iostream>
#include <memory>
#include <optional>

#include "arguments.hpp"
#include "commands.hpp"
#include "connection.hpp"
#include "exit_codes.hpp"
#include "status_check.hpp"
#include "status_format.hpp"

namespace pgmutex::cli {
namespace {

struct StatusArgs {
  ConnectionArgs connection;
  ThresholdArgs thresholds{};
  std::string lock;
  bool json = false;
  std::string format = "text";
  bool check = false;
};

// --check: whatever goes wrong is UNKNOWN (3), said in the one line on stdout
// that a monitoring system reads.
int check(const StatusArgs& args) {
  if (args.json || args.format != "text")
    throw Exit(exit_code::usage, "status: --check and --json or --format do not go together");
  if (args.lock.empty()) throw Exit(exit_code::usage, "status --check needs a lock NAME: pgmutex status --check NAME");
  check_threshold_order(args.thresholds);
  CheckResult result{check_code::unknown, ""};
  try {
    PostgresBackend backend = connect_backend(args.connection);
    auto row = backend.inspect(LockRef{args.connection.table, args.lock});
    if (!row) exit_with(row.error(), "status", args.connection);
    result = check_lock(args.lock, *row, args.thresholds);
  } catch (const Exit& exit) {
    result = check_unknown(exit.what());
  }
  std::cout << result.line << '\n';
  std::cout.flush();
  return result.code;
}

int execute(const StatusArgs& args) {
  if (args.check) return check(args);
  check_threshold_order(args.thresholds);
  PostgresBackend backend = connect_backend(args.connection);

  StatusReport report{args.connection.table, std::nullopt, args.thresholds, {}, {}, {}};
  if (!args.lock.empty()) {
    report.lock = args.lock;
    auto row = backend.inspect(LockRef{args.connection.table, args.lock});
    if (!row) exit_with(row.error(), "status", args.connection);
    if (*row) report.rows.push_back(std::move(**row));
  } else {
    auto rows = backend.list(args.connection.table);
    if (!rows) exit_with(rows.error(), "status", args.connection);
    report.rows = std::move(*rows);
  }
  // A reader allowed the lock table but not its queue still sees the
  // locks; the waiters are left out, said on stderr with the GRANT to run.
  auto queue = backend.list_queue(args.connection.table);
  if (queue)
    report.queue = std::move(*queue);
  else if (queue.error() == Errc::permission_denied)
    std::cerr << "pgmutex: status: the queues are not shown: " << queue.error().message() << '\n';
  else
    exit_with(queue.error(), "status", args.connection);
  if (report.lock) std::erase_if(report.queue, [&](const QueuedWaiterRow& w) { return w.lock_name != *report.lock; });
  // No leaders are shown from a table made before elections existed (no
  // election table), nor to a reader granted what the permission hints name
  // (SELECT on the lock table and its queue) and not the election table: a
  // monitoring role set up as documented must see the locks without a warning.
  auto elections = backend.list_elections(args.connection.table, to_duration(args.thresholds.stale_s));
  if (elections)
    report.elections = std::move(*elections);
  else if (elections.error() != Errc::schema_missing && elections.error() != Errc::permission_denied)
    exit_with(elections.error(), "status", args.connection);
  if (report.lock) std::erase_if(report.elections, [&](const ElectionRow& e) { return e.lock_name != *report.lock; });

  const std::string format = args.json ? "json" : args.format;
  if (format == "json")
    std::cout << to_json(report).dump(2) << '\n';
  else if (format == "prometheus")
    std::cout << format_prometheus(report);
  else
    std::cout << format_text(report);
  std::cout.flush();
  return std::cout ? exit_code::ok : exit_code::internal;
}

}  // namespace

CommandRunner add_status_command(CLI::App& app) {
  auto args = std::make_shared<StatusArgs>();
  CLI::App* status = app.add_subcommand("status", "Show held locks: holder, fence, heartbeat age, ok/alert/expired/stale");
  status->add_option("name", args->lock, "show only this lock")->type_name("NAME")->check(lock_name_validator());
  CLI::Option* json = status->add_flag("--json", args->json, "print JSON instead of a table (as --format json)");
  status->add_option("--format", args->format,
                     "text (a table), json, or prometheus (the text exposition format, for node_exporter's textfile "
                     "collector or a scrape)")
      ->capture_default_str()
      ->type_name("FORMAT")
      ->check(CLI::IsMember({"text", "json", "prometheus"}))
      ->excludes(json);
  status->add_flag("--check", args->check,
                   "monitoring: one line on stdout; exit 0 ok or free, 1 alert, 2 expired or stale, 3 unknown (cannot tell)");
  add_threshold_options(*status, args->thresholds);
  add_connection_options(*status, args->connection);
  status->footer(R"(States: ok; alert (no heartbeat for --alert-threshold seconds: is the holder
slow or dead?); expired (no heartbeat for the stale threshold the holder stored:
its lease is over, its row is left over, but --stale-threshold does not reclaim
it yet); stale (no heartbeat for the larger of --stale-threshold and the
holder's: an instance with these thresholds reclaims it, the rule every acquire
uses). Ages come from the server's clock.

Examples:
  pgmutex status
  pgmutex status nightly-report --json | jq '.locks[0].state'
  pgmutex status --format prometheus > /var/lib/node_exporter/textfile/pgmutex.prom.$$ &&
    mv /var/lib/node_exporter/textfile/pgmutex.prom.$$ /var/lib/node_exporter/textfile/pgmutex.prom
  pgmutex status --alert-threshold 60 --stale-threshold 900
  pgmutex status --check nightly-report     # a Nagios/Icinga check: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN)");
  return [args] { return execute(*args); };
}

}  // namespace pgmutex::cli
