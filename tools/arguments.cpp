// The flags several subcommands share, and their checks against the library's
// rules (arguments.hpp).
#include "arguments.hpp"

#include <cmath>
#include <string_view>
#include <utility>

#include "exit_codes.hpp"
#include "pgmutex/describe/options.hpp"
#include "pgmutex/describe/record.hpp"
#include "pgmutex/options.hpp"

namespace pgmutex::cli {
namespace {

constexpr double max_seconds = 1e8;  // ~3 years: far beyond any sane threshold, far from overflow

}  // namespace

void add_connection_options(CLI::App& command, ConnectionArgs& args) {
  command
      .add_option("--dsn", args.dsn,
                  "libpq connection string, keyword or URI form; without it and PGMUTEX_DSN: "
                  "the PG* environment and ~/.pgpass")
      ->envname("PGMUTEX_DSN")
      ->type_name("DSN");
  args.table = Options{}.table;
  const FlagText table = flag_of(&Options::table);
  command.add_option(table.name, args.table, table.help)
      ->capture_default_str()
      ->type_name("TABLE")
      ->check(table_name_validator());
  command
      .add_option("--statement-mode", args.statement_mode,
                  "auto: prepared statements and LISTEN on a direct connection, unnamed behind a pooler; "
                  "prepared; unnamed: for a transaction pooler (pgbouncer pool_mode=transaction), no prepared "
                  "statements, waits poll the table")
      ->envname("PGMUTEX_STATEMENT_MODE")
      ->capture_default_str()
      ->type_name("MODE")
      ->check(CLI::IsMember({"auto", "prepared", "unnamed"}));
}

void add_threshold_options(CLI::App& command, ThresholdArgs& args) {
  const Options defaults;
  args.alert_s = to_seconds(defaults.alert_threshold);
  args.stale_s = to_seconds(defaults.stale_threshold);
  const FlagText alert = flag_of(&Options::alert_threshold);
  const FlagText stale = flag_of(&Options::stale_threshold);
  command.add_option(alert.name, args.alert_s, alert.help)
      ->capture_default_str()
      ->type_name("S")
      ->check(seconds_validator());
  command.add_option(stale.name, args.stale_s, stale.help)
      ->capture_default_str()
      ->type_name("S")
      ->check(seconds_validator());
}

CLI::Validator seconds_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || !std::isfinite(value))
          return "'" + text + "' is not a number of seconds";
        if (value < 0 || value > max_seconds)
          return "'" + text + "' is out of range: give seconds from 0 to " +
                 std::to_string(static_cast<long long>(max_seconds));
        return {};
      },
      "", "seconds");
}

CLI::Validator lock_name_validator() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        auto valid = validate_lock_name(name, "lock name");
        return valid ? std::string() : valid.error().detail;
      },
      "", "lock name");
}

CLI::Validator table_name_validator() {
  return CLI::Validator(
      [](std::string& table) -> std::string {
        auto valid = validate_table_name(table);
        return valid ? std::string() : valid.error().detail;
      },
      "", "table name");
}

std::chrono::nanoseconds to_duration(double seconds) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(seconds));
}

double to_seconds(std::chrono::nanoseconds duration) { return std::chrono::duration<double>(duration).count(); }

void check_threshold_order(const ThresholdArgs& thresholds) {
  // The library's validate() holds the rule; give it a heartbeat interval that
  // can never be the problem, so only the thresholds are judged.
  Options options;
  options.lock_name = "status";
  options.alert_threshold = to_duration(thresholds.alert_s);
  options.stale_threshold = to_duration(thresholds.stale_s);
  options.heartbeat_interval = options.alert_threshold / 2;
  if (options.heartbeat_interval <= std::chrono::nanoseconds::zero())
    throw Exit(exit_code::usage, "--alert-threshold must be > 0");
  if (auto valid = validate(std::move(options)); !valid)
    throw Exit(exit_code::usage, in_flag_terms(valid.error().detail));
}

std::string in_flag_terms(std::string message) {
  const auto word = [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; };
  for (const describe::Field& field : describe::Description<Options>::fields) {
    if (field.flag.empty()) continue;
    for (auto at = message.find(field.name); at != std::string::npos; at = message.find(field.name, at + 1)) {
      const std::size_t end = at + field.name.size();
      if ((at > 0 && word(message[at - 1])) || (end < message.size() && word(message[end]))) continue;
      message.replace(at, field.name.size(), field.flag);
    }
  }
  return message;
}

FlagText flag_of(std::string Options::*member) {
  const describe::Field& field = describe::field_of(member);
  return {std::string(field.flag), std::string(field.doc), std::string(field.name)};
}

FlagText flag_of(std::optional<std::chrono::nanoseconds> Options::*member) {
  const describe::Field& field = describe::field_of(member);
  return {std::string(field.flag), std::string(field.doc), std::string(field.name)};
}

FlagText flag_of(std::chrono::nanoseconds Options::*member) {
  const describe::Field& field = describe::field_of(member);
  return {std::string(field.flag), std::string(field.doc), std::string(field.name)};
}

}  // namespace pgmutex::cli
