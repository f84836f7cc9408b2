// pgmutex: run a command under a distributed lock held in Postgres, and
// inspect or administer those locks.
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "terminal_text.hpp"
#include "version.hpp"

namespace {

using pgmutex::cli::CommandRunner;
namespace exit_code = pgmutex::cli::exit_code;

constexpr const char* overview = R"(Examples:
  pgmutex schema                                   # once: create the lock table
  pgmutex run --lock nightly-report -- ./report.sh # exit 75 at once if it is taken
  pgmutex run --lock deploy --wait --timeout 300 -- make deploy
  pgmutex status                                   # every held lock, ok/alert/stale
  pgmutex status nightly-report --json
  pgmutex release --force nightly-report           # an administrator takes it away

In crontab, where you would write   flock -n /tmp/report.lock ./report.sh
write                               pgmutex run --lock report -- ./report.sh
and the lock holds across every machine that reaches the same Postgres.

Connection: --dsn, else $PGMUTEX_DSN, else libpq's PGHOST, PGPORT, PGUSER,
PGDATABASE, PGPASSWORD and ~/.pgpass. Passwords are never printed.

Exit codes: the command's own; 64 usage error or a DSN value libpq refuses;
69 Postgres unreachable; 70 lock lost while the command ran; 71 internal error;
75 lock taken (see run -E); 76 the database refused for another reason;
77 permission denied or authentication failed; 78 lock table, column or
database missing (the message gives the command that fixes it);
126/127 command not executable/not found; 128+N killed by signal N.
status --check: 0 ok, 1 alert, 2 stale, 3 unknown.)";

bool has_separator(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--") return true;
  return false;
}

// The first word that is not a flag: the subcommand the user meant.
std::string_view first_word(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (argv[i][0] != '-') return argv[i];
  return {};
}

int usage_error(CLI::App& app, const CLI::ParseError& error, int argc, char** argv, bool separator) {
  std::string message = error.what();
  const std::string word(first_word(argc, argv));
  const bool known =
      !word.empty() && !app.get_subcommands([&](CLI::App* sub) { return sub->check_name(word); }).empty();
  std::string help = "pgmutex --help";
  if (known) {
    help = "pgmutex " + word + " --help";
    if (word == "run" && !separator && dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr)
      message = "run: missing '--' before the command (" + message + ")";
  } else if (!word.empty()) {
    message = "unknown subcommand '" + word + "': expected run, status, release or schema";
  }
  std::fprintf(stderr, "pgmutex: %s\nRun '%s' for usage.\n", message.c_str(), help.c_str());
  return exit_code::usage;
}

}  // namespace

int main(int argc, char** argv) {
  const bool separator = has_separator(argc, argv);

  CLI::App app("pgmutex: run a command under a distributed lock held in Postgres; inspect and administer locks",
               "pgmutex");
  app.set_version_flag("--version", std::string("pgmutex ") + pgmutex::cli::version);
  app.require_subcommand(1);
  app.footer(overview);

  std::vector<std::pair<CLI::App*, CommandRunner>> commands;
  commands.emplace_back(nullptr, pgmutex::cli::add_run_command(app, separator));
  commands.back().first = app.get_subcommand("run");
  commands.emplace_back(nullptr, pgmutex::cli::add_status_command(app));
  commands.back().first = app.get_subcommand("status");
  commands.emplace_back(nullptr, pgmutex::cli::add_release_command(app));
  commands.back().first = app.get_subcommand("release");
  commands.emplace_back(nullptr, pgmutex::cli::add_schema_command(app));
  commands.back().first = app.get_subcommand("schema");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(error);  // --help, --version
    return usage_error(app, error, argc, argv, separator);
  }

  try {
    for (const auto& [command, runner] : commands)
      if (command->parsed()) return runner();
    return exit_code::usage;  // unreachable: require_subcommand(1)
  } catch (const pgmutex::cli::Exit& exit) {
    if (*exit.what() != '\0') std::fprintf(stderr, "pgmutex: %s\n", pgmutex::cli::one_line(exit.what()).c_str());
    return exit.code();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pgmutex: internal error: %s\n", pgmutex::cli::one_line(error.what()).c_str());
    return exit_code::internal;
  }
}
