// Exit codes, as sysexits(3) and the shell define them, and the one exception
// a command throws to stop with a code and a message.
#pragma once

#include <stdexcept>
#include <string>

#include "pgmutex/error.hpp"

namespace pgmutex::cli {

namespace exit_code {
inline constexpr int ok = 0;
inline constexpr int usage = 64;            // EX_USAGE: bad flag, value or lock name
inline constexpr int unavailable = 69;      // EX_UNAVAILABLE: the server cannot be reached
inline constexpr int software = 70;         // EX_SOFTWARE: lease lost, or the database refused a request
inline constexpr int temporary = 75;        // EX_TEMPFAIL: the lock is taken (or still taken after --timeout)
inline constexpr int not_executable = 126;  // as a shell: the command exists but cannot run
inline constexpr int not_found = 127;       // as a shell: no such command
inline constexpr int signal_base = 128;     // 128 + N: the command was killed by signal N
}  // namespace exit_code

// Thrown by a command to end the program: main() prints the message (if any)
// on stderr, prefixed with "pgmutex: ", and exits with the code.
class Exit : public std::runtime_error {
 public:
  Exit(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

// The exit code that a library error calls for.
[[nodiscard]] int exit_code_for(const Error& error) noexcept;

// Throws Exit with the error's code and a one-line message: `what` (e.g.
// "status") and the library's message, or a plain hint when `table` does not
// exist.
[[noreturn]] void exit_with(const Error& error, const std::string& what, const std::string& table);

}  // namespace pgmutex::cli
