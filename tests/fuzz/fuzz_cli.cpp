// Fuzz target: command-line parsing. The input is split at NUL bytes into
// words, given to the pgmutex command's parser after "pgmutex": whatever the
// words, parsing never crashes or throws, and it ends in one of three ways:
// a subcommand to run, exit 0 after --help/--version, or exit 64 (usage error)
// with a message that says what to run for usage. Nothing is run: the
// subcommands would need a server.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "command_line.hpp"
#include "exit_codes.hpp"

namespace {

[[noreturn]] void fail(const char* what, const std::vector<std::string>& words, const std::string& detail) {
  std::fprintf(stderr, "%s\n", what);
  for (const std::string& w : words) std::fprintf(stderr, "  word: [%s]\n", w.c_str());
  std::fprintf(stderr, "  %s\n", detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> words{"pgmutex"};
  std::string word;
  for (std::size_t i = 0; i < size && words.size() < 40; ++i) {
    if (data[i] == 0) {
      words.push_back(word);
      word.clear();
    } else {
      word.push_back(static_cast<char>(data[i]));
    }
  }
  if (!word.empty() && words.size() < 40) words.push_back(word);
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  argv.push_back(nullptr);

  std::ostringstream out, err;
  pgmutex::cli::ParsedCommandLine parsed;
  try {
    parsed = pgmutex::cli::parse_command_line(static_cast<int>(words.size()), argv.data(), out, err);
  } catch (const std::exception& e) {
    fail("the parser threw", words, e.what());
  } catch (...) {
    fail("the parser threw a non-exception", words, "");
  }
  if (!parsed.exit_code) {
    if (!parsed.runner) fail("no subcommand and no exit code", words, "");
  } else if (*parsed.exit_code == pgmutex::cli::exit_code::usage) {
    if (err.str().find("for usage.") == std::string::npos && err.str().find("--help") == std::string::npos)
      fail("a usage error without a pointer to --help", words, err.str());
  } else if (*parsed.exit_code != pgmutex::cli::exit_code::ok) {
    fail("an exit code other than 0 or 64", words, std::to_string(*parsed.exit_code));
  }
  return 0;
}
