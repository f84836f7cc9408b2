// Each subcommand adds itself to the app and returns what runs it once the
// command line has been parsed.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace pgmutex::cli {

// Returns the exit code; throws Exit to stop with a code and a message.
using CommandRunner = std::function<int()>;

// run's and elect's command is every word after "--"; parse_command_line puts
// the "--" before the first command word where the user left it out.
CommandRunner add_run_command(CLI::App& app);
CommandRunner add_elect_command(CLI::App& app);
CommandRunner add_status_command(CLI::App& app);
CommandRunner add_release_command(CLI::App& app);
CommandRunner add_schema_command(CLI::App& app);

}  // namespace pgmutex::cli
