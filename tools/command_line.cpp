#include "command_line.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "exit_codes.hpp"
#include "version.hpp"

namespace pgmutex::cli {

namespace {

constexpr const char* overview = R"(Examples:
  pgmutex schema                                   # once: create the lock table
  pgmutex run --lock nightly-report -- ./report.sh # exit 75 at once if it is taken
  pgmutex run --lock deploy --wait --timeout 300 -- make deploy
  pgmutex status                                   # every held lock, ok/alert/expired/stale
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
status --check: 0 ok, 1 alert, 2 expired or stale, 3 unknown.)";

bool has_separator(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--") return true;
  return false;
}

// The first word that is not a flag: the subcommand the user meant.
std::string_view first_word(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i)
    if (argv[i][0] != '-') return argv[i];
  return {};
}

int usage_error(CLI::App& app, const CLI::ParseError& error, int argc, const char* const* argv, bool separator,
                std::ostream& err) {
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
  err << "pgmutex: " << message << "\nRun '" << help << "' for usage.\n" << std::flush;
  return exit_code::usage;
}

}  // namespace

ParsedCommandLine parse_command_line(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  const bool separator = has_separator(argc, argv);
  ParsedCommandLine parsed;
  parsed.app = std::make_unique<CLI::App>(
      "pgmutex: run a command under a distributed lock held in Postgres; inspect and administer locks", "pgmutex");
  CLI::App& app = *parsed.app;
  app.set_version_flag("--version", std::string("pgmutex ") + version);
  app.require_subcommand(1);
  app.footer(overview);

  std::vector<std::pair<CLI::App*, CommandRunner>> commands;
  commands.emplace_back(nullptr, add_run_command(app, separator));
  commands.back().first = app.get_subcommand("run");
  commands.emplace_back(nullptr, add_status_command(app));
  commands.back().first = app.get_subcommand("status");
  commands.emplace_back(nullptr, add_release_command(app));
  commands.back().first = app.get_subcommand("release");
  commands.emplace_back(nullptr, add_schema_command(app));
  commands.back().first = app.get_subcommand("schema");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {  // --help, --version
      parsed.exit_code = app.exit(error, out, err);
      return parsed;
    }
    parsed.exit_code = usage_error(app, error, argc, argv, separator, err);
    return parsed;
  }
  for (auto& [command, runner] : commands)
    if (command->parsed()) {
      parsed.runner = std::move(runner);
      return parsed;
    }
  parsed.exit_code = exit_code::usage;  // unreachable: require_subcommand(1)
  return parsed;
}

}  // namespace pgmutex::cli
