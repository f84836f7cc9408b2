// The command line (command_line.hpp): every subcommand, its flags and what a
// parse error prints.
#include "command_line.hpp"

#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "exit_codes.hpp"
#include "help_format.hpp"
#include "version.hpp"

namespace pgmutex::cli {

namespace {

constexpr const char* overview = R"(Examples:
  pgmutex schema                                   # once: create the lock table
  pgmutex run --lock nightly-report -- ./report.sh # exit 75 at once if it is taken
  pgmutex run --lock deploy --wait --timeout 300 -- make deploy
  pgmutex status                                   # every held lock, ok/alert/expired/stale
  pgmutex status nightly-report --json
  pgmutex elect --lock primary --value 10.0.0.7:5432 -- ./serve.sh  # lead, FIFO
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

// Whether `option` (a flag or an option of `command`) takes a value from the next word.
bool takes_value(const CLI::Option& option) { return option.get_expected_max() != 0; }

// The index of the word that starts run's (or elect's) command when no "--" comes before
// it: the first word that is neither a run option nor an option's value, as
// flock and env read theirs. Everything from there on is the command's, even
// words that look like options. Returns 0 when there is nothing to mark: a
// "--" comes first, no command word follows, or an unknown option comes first
// (CLI11 reports it).
int command_start(const CLI::App& command, int argc, const char* const* argv, int after) {
  for (int i = after; i < argc; ++i) {
    const std::string_view word = argv[i];
    if (word == "--") return 0;
    if (word.size() < 2 || word[0] != '-') return i;
    if (word.starts_with("--")) {
      const std::string_view name = word.substr(0, word.find('='));
      const CLI::Option* option = command.get_option_no_throw(std::string(name));
      if (option == nullptr) return 0;
      if (takes_value(*option) && name.size() == word.size()) ++i;
      continue;
    }
    // -qv, -w5, -E 0: short flags may be grouped; the first that takes a
    // value takes the rest of the word, or the next word.
    for (std::size_t c = 1; c < word.size(); ++c) {
      const CLI::Option* option = command.get_option_no_throw(std::string{'-', word[c]});
      if (option == nullptr) return 0;
      if (takes_value(*option)) {
        if (c + 1 == word.size()) ++i;
        break;
      }
    }
  }
  return 0;
}

// argv with "--" put before run's or elect's command where the user left it
// out, so that CLI11 leaves the command's own options to it.
std::vector<const char*> with_separator(const CLI::App& app, int argc, const char* const* argv) {
  std::vector<const char*> words(argv, argv + argc);
  int sub = 1;
  while (sub < argc && argv[sub][0] == '-') ++sub;
  if (sub >= argc || (std::string_view(argv[sub]) != "run" && std::string_view(argv[sub]) != "elect")) return words;
  if (const int start = command_start(*app.get_subcommand(argv[sub]), argc, argv, sub + 1); start > 0)
    words.insert(words.begin() + start, "--");
  return words;
}

// The first word that is not a flag: the subcommand the user meant.
std::string_view first_word(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i)
    if (argv[i][0] != '-') return argv[i];
  return {};
}

int usage_error(CLI::App& app, const CLI::ParseError& error, int argc, const char* const* argv, std::ostream& err) {
  std::string message = error.what();
  const std::string word(first_word(argc, argv));
  const bool known =
      !word.empty() && !app.get_subcommands([&](CLI::App* sub) { return sub->check_name(word); }).empty();
  std::string help = "pgmutex --help";
  if (known) {
    help = "pgmutex " + word + " --help";
  } else if (!word.empty()) {
    message = "unknown subcommand '" + word + "': expected run, elect, status, release, schema or help";
  }
  err << "pgmutex: " << message << "\nRun '" << help << "' for usage.\n" << std::flush;
  return exit_code::usage;
}

// pgmutex help [SUBCOMMAND]: what --help prints, as git help and go help do.
CommandRunner add_help_command(CLI::App& app) {
  auto subcommand = std::make_shared<std::string>();
  CLI::App* help = app.add_subcommand("help", "Print the help of a subcommand, or with none this overview");
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    if (sub != help) names.push_back(sub->get_name());
  help->add_option("SUBCOMMAND", *subcommand, "the subcommand whose help to print: run, elect, status, release or schema")
      ->type_name("")
      ->check(CLI::IsMember(names));
  help->footer(R"(Examples:
  pgmutex help run      # the same as pgmutex run --help
  pgmutex help          # the same as pgmutex --help)");
  return [&app, subcommand] {
    if (subcommand->empty()) std::cout << app.get_formatter()->make_help(&app, app.get_name(), CLI::AppFormatMode::Normal);
    else std::cout << app.get_subcommand(*subcommand)->help(app.get_name());
    std::cout << std::flush;
    return 0;
  };
}

}  // namespace

ParsedCommandLine parse_command_line(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  ParsedCommandLine parsed;
  parsed.app = std::make_unique<CLI::App>(
      "pgmutex: run a command under a distributed lock held in Postgres; inspect and administer locks", "pgmutex");
  CLI::App& app = *parsed.app;
  app.set_version_flag("--version", std::string("pgmutex ") + version);
  app.require_subcommand(1);
  app.footer(overview);
  // Before the subcommands: each takes a copy of the app's formatter.
  auto format = std::make_shared<HelpFormatter>(help_width());
  format->set_usage("run",
                    "pgmutex run --lock NAME [OPTIONS] [--] COMMAND [ARGS...]\n"
                    "pgmutex run --lock NAME [OPTIONS] -c STRING\n"
                    "pgmutex run --lock NAME [OPTIONS]     (no command: hold the lock)");
  format->set_usage("elect",
                    "pgmutex elect --lock NAME --value VALUE [OPTIONS] [--] COMMAND [ARGS...]\n"
                    "pgmutex elect --lock NAME --value VALUE [OPTIONS]     (no command: lead until a signal)");
  app.formatter(format);

  std::vector<std::pair<CLI::App*, CommandRunner>> commands;
  commands.emplace_back(nullptr, add_run_command(app));
  commands.back().first = app.get_subcommand("run");
  commands.emplace_back(nullptr, add_elect_command(app));
  commands.back().first = app.get_subcommand("elect");
  commands.emplace_back(nullptr, add_status_command(app));
  commands.back().first = app.get_subcommand("status");
  commands.emplace_back(nullptr, add_release_command(app));
  commands.back().first = app.get_subcommand("release");
  commands.emplace_back(nullptr, add_schema_command(app));
  commands.back().first = app.get_subcommand("schema");
  commands.emplace_back(nullptr, add_help_command(app));
  commands.back().first = app.get_subcommand("help");

  try {
    const std::vector<const char*> words = with_separator(app, argc, argv);
    app.parse(static_cast<int>(words.size()), words.data());
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {  // --help, --version
      parsed.exit_code = app.exit(error, out, err);
      return parsed;
    }
    parsed.exit_code = usage_error(app, error, argc, argv, err);
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
