// The flags several subcommands share, and the checks that keep their values
// to the library's rules (so the command and the library never disagree).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "pgmutex/options.hpp"

namespace pgmutex::cli {

struct ConnectionArgs {
  std::string dsn;  // --dsn, else PGMUTEX_DSN, else empty: libpq's PG* variables and .pgpass
  std::string table;
  // --statement-mode, else PGMUTEX_STATEMENT_MODE: auto, prepared or unnamed
  // (PostgresOptions::statement_mode; unnamed for a transaction pooler).
  std::string statement_mode = "auto";
};

struct ThresholdArgs {
  double alert_s;
  double stale_s;
};

// An Options member's flag and help, as its description (describe/options.hpp) gives them.
struct FlagText {
  std::string name;    // "--alert-threshold", or words ("the safety margin") for an option without a flag
  std::string help;
  std::string option;  // the library's name: "alert_threshold"
};
[[nodiscard]] FlagText flag_of(std::string Options::*member);
[[nodiscard]] FlagText flag_of(std::chrono::nanoseconds Options::*member);
[[nodiscard]] FlagText flag_of(std::optional<std::chrono::nanoseconds> Options::*member);

// --dsn (with PGMUTEX_DSN as fallback), --table and --statement-mode (with
// PGMUTEX_STATEMENT_MODE as fallback).
void add_connection_options(CLI::App& command, ConnectionArgs& args);

// --alert-threshold and --stale-threshold, defaulting to the library's values.
void add_threshold_options(CLI::App& command, ThresholdArgs& args);

// A number of seconds: finite, not negative, at most ~3 years.
[[nodiscard]] CLI::Validator seconds_validator();

// A lock name as the library accepts it (1..64 characters of valid UTF-8).
[[nodiscard]] CLI::Validator lock_name_validator();

// A table name as the library accepts it (identifier or schema.identifier).
[[nodiscard]] CLI::Validator table_name_validator();

[[nodiscard]] std::chrono::nanoseconds to_duration(double seconds);
[[nodiscard]] double to_seconds(std::chrono::nanoseconds duration);

// The library names options as in Options ("alert_threshold"); the command
// names them as flags ("--alert-threshold"), as the description says.
[[nodiscard]] std::string in_flag_terms(std::string library_message);

// Throws Exit(usage) unless alert < stale, by the library's own rule.
void check_threshold_order(const ThresholdArgs& thresholds);

}  // namespace pgmutex::cli
