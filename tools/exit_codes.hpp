// Exit codes, as sysexits(3) and the shell define them, one per class of
// failure so that a script can tell them apart, and the one exception a
// command throws to stop with a code and a message.
#pragma once

#include <stdexcept>
#include <string>

#include "arguments.hpp"
#include "pgmutex/error.hpp"

namespace pgmutex::cli {

namespace exit_code {
inline constexpr int ok = 0;
inline constexpr int usage = 64;            // EX_USAGE: bad flag, value, lock name, or a DSN value libpq refuses
inline constexpr int unavailable = 69;      // EX_UNAVAILABLE: the server cannot be reached (or not now)
inline constexpr int lost = 70;             // EX_SOFTWARE: the lock was lost while the command ran; nothing else
inline constexpr int internal = 71;         // EX_OSERR: pgmutex itself failed (a bug, or the system refused it)
inline constexpr int temporary = 75;        // EX_TEMPFAIL: the lock is taken (or still taken after --timeout)
inline constexpr int refused = 76;          // EX_PROTOCOL: the database refused a request for another reason
inline constexpr int no_permission = 77;    // EX_NOPERM: a privilege is missing, or authentication failed
inline constexpr int config = 78;           // EX_CONFIG: the lock table, a column or the database does not exist
inline constexpr int not_executable = 126;  // as a shell: the command exists but cannot run
inline constexpr int not_found = 127;       // as a shell: no such command
inline constexpr int signal_base = 128;     // 128 + N: the command was killed by signal N
}  // namespace exit_code

// Thrown by a command to end the program: main() prints the message (if any)
// on stderr, prefixed with "pgmutex: " and made one line, and exits with the code.
class Exit : public std::runtime_error {
 public:
  Exit(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

// The exit code that a library error calls for.
[[nodiscard]] int exit_code_for(const Error& error) noexcept;

// Throws Exit with the error's code and a message: `what` (e.g. "status"),
// the library's message, and for a refusal that retrying cannot fix, the
// command or GRANT that fixes it, written for `connection`.
[[noreturn]] void exit_with(const Error& error, const std::string& what, const ConnectionArgs& connection);

}  // namespace pgmutex::cli
