// What the command prints of names and server messages: never a raw control
// character, and one line per event.
#include <catch2/catch.hpp>

#include "terminal_text.hpp"

using pgmutex::cli::one_line;
using pgmutex::cli::shown;

TEST_CASE("shown() escapes every control character and keeps the rest", "[cli][text]") {
  CHECK(shown("nightly-report") == "nightly-report");
  CHECK(shown("a\nb\tc\rd") == "a\\nb\\tc\\rd");
  CHECK(shown("\x1b[31mred") == "\\x1b[31mred");
  CHECK(shown(std::string("nul\0x", 5)) == "nul\\x00x");
  CHECK(shown("del\x7f") == "del\\x7f");
  CHECK(shown("csi\xc2\x9b" "31m") == "csi\\u009b31m");  // U+009B, the one-byte CSI
  CHECK(shown("caf\xc3\xa9 \xe2\x9c\x93") == "caf\xc3\xa9 \xe2\x9c\x93");  // UTF-8 text is kept
}

TEST_CASE("one_line() folds libpq's continuation lines and drops the quoted statement", "[cli][text]") {
  CHECK(one_line("connection to server at \"db\" (10.0.0.1), port 5432 failed: Connection refused\n"
                 "\tIs the server running on that host and accepting TCP/IP connections?\n") ==
        "connection to server at \"db\" (10.0.0.1), port 5432 failed: Connection refused Is the server running on "
        "that host and accepting TCP/IP connections?");
  CHECK(one_line("ERROR:  column \"fence\" does not exist\nLINE 1: SELECT fence FROM t\n               ^\n") ==
        "ERROR:  column \"fence\" does not exist");
  CHECK(one_line("lock 'a\x1b[2Jb' lost") == "lock 'a\\x1b[2Jb' lost");
  CHECK(one_line("") == "");
}
