// pgmutex release --force NAME: an administrator removes a lock, whoever holds it.
#include <cstdio>
#include <iostream>
#include <memory>

#include "arguments.hpp"
#include "commands.hpp"
#include "connection.hpp"
#include "exit_codes.hpp"
#include "terminal_text.hpp"
#include "status_format.hpp"

namespace pgmutex::cli {
namespace {

struct ReleaseArgs {
  ConnectionArgs connection;
  std::string lock;
  bool force = false;
};

int execute(const ReleaseArgs& args) {
  PostgresBackend backend = connect_backend(args.connection);
  auto removed = backend.force_release(LockRef{args.connection.table, args.lock});
  if (!removed) exit_with(removed.error(), "release", args.connection);
  if (!*removed) {
    std::cout << "lock '" << shown(args.lock) << "' was not held: nothing to release\n";
    return exit_code::ok;
  }
  const LockRow& row = **removed;
  char age[32];
  std::snprintf(age, sizeof age, "%.1f", row.seconds_since_heartbeat);
  const std::string where = holder_where(row);
  std::cout << "released lock '" << shown(row.lock_name) << "' held by " << shown(row.instance_id) << " (fence "
            << row.fence << ", acquired " << iso8601(row.acquired_at) << ", last heartbeat " << age << " s ago"
            << (where.empty() ? "" : "; " + where) << ")\n";
  return exit_code::ok;
}

}  // namespace

CommandRunner add_release_command(CLI::App& app) {
  auto args = std::make_shared<ReleaseArgs>();
  CLI::App* release = app.add_subcommand("release", "Remove a lock whoever holds it (needs --force)");
  release->add_option("name", args->lock, "the lock to remove")
      ->required()
      ->type_name("NAME")
      ->check(lock_name_validator());
  release->add_flag("--force", args->force, "confirm: the holder loses the lock and is told so at its next heartbeat")
      ->required();
  add_connection_options(*release, args->connection);
  release->footer(R"(The holder finds out at its next heartbeat: a `pgmutex run` holder then stops
its command (SIGTERM, SIGKILL after --grace) and exits 70.

Example:
  pgmutex release --force nightly-report)");
  return [args] { return execute(*args); };
}

}  // namespace pgmutex::cli
