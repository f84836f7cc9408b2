// pgmutex: run a command under a distributed lock held in Postgres, and
// inspect or administer those locks.
#include <cstdio>
#include <exception>

#include "command_line.hpp"
#include "exit_codes.hpp"
#include "terminal_text.hpp"

namespace exit_code = pgmutex::cli::exit_code;

int main(int argc, char** argv) {
  auto parsed = pgmutex::cli::parse_command_line(argc, argv);
  if (parsed.exit_code) return *parsed.exit_code;

  try {
    return parsed.runner();
  } catch (const pgmutex::cli::Exit& exit) {
    if (*exit.what() != '\0') std::fprintf(stderr, "pgmutex: %s\n", pgmutex::cli::one_line(exit.what()).c_str());
    return exit.code();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pgmutex: internal error: %s\n", pgmutex::cli::one_line(error.what()).c_str());
    return exit_code::internal;
  }
}
