// Text that reaches a terminal or a log: a lock name, a holder or a server's
// message may hold newlines or escape sequences (a lock name is any UTF-8), and
// printed raw they would forge lines in a log or drive the terminal.
#pragma once

#include <string>
#include <string_view>

namespace pgmutex::cli {

// `text` with every control character (C0, DEL, and C1 as UTF-8) written as an
// escape: "\n", "\t", "\r", "\x1b", "\u009b". Everything else is kept.
[[nodiscard]] std::string shown(std::string_view text);

// A message made one line: libpq's continuation lines ("\n\tIs the server
// running...") joined with a space, the statement Postgres quotes ("LINE 1:
// ...") and its caret line dropped, then shown().
[[nodiscard]] std::string one_line(std::string_view message);

}  // namespace pgmutex::cli
