// The command line: every subcommand and its flags, and what a parse error
// prints. main() runs what it chose; tests/fuzz parses arbitrary words through it.
#pragma once

#include <iostream>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>

#include "commands.hpp"

namespace pgmutex::cli {

struct ParsedCommandLine {
  std::unique_ptr<CLI::App> app;  // the runner's flags point into it: keep it while the runner runs
  CommandRunner runner;           // the chosen subcommand, unless exit_code is set
  std::optional<int> exit_code;   // set: exit with it (0 after --help or --version, 64 after a usage error)
};

// Parses argv. A usage error is written to `err` (with the --help to run),
// --help and --version to `out`; nothing is thrown for any argv.
ParsedCommandLine parse_command_line(int argc, const char* const* argv, std::ostream& out = std::cout,
                                     std::ostream& err = std::cerr);

}  // namespace pgmutex::cli
