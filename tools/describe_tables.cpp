// describe_tables NAME: the README's table NAME, in Markdown, made from the
// records' descriptions, or for flags, from the flags the command registers
// (whose names, help and defaults come from those descriptions). describe_tables --list: the names. The README keeps
// each table between <!-- describe:NAME:begin --> and <!-- describe:NAME:end -->,
// and tests/readme_tables.py fails with a diff if the two differ.
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "pgmutex/describe/lock_metrics.hpp"
#include "pgmutex/describe/options.hpp"
#include "pgmutex/describe/record.hpp"
#include "run_report_description.hpp"
#include "status_description.hpp"

namespace {

namespace describe = pgmutex::describe;

std::string code(std::string_view text) { return "`" + std::string(text) + "`"; }

std::string duration_text(std::chrono::nanoseconds d) {
  using namespace std::chrono;
  if (d % seconds(1) == nanoseconds::zero()) return std::to_string(duration_cast<seconds>(d).count()) + " s";
  return std::to_string(duration_cast<milliseconds>(d).count()) + " ms";
}

template <class T>
std::string default_of(const describe::Field& field, const T& value) {
  if (!field.default_text.empty()) return std::string(field.default_text);
  if constexpr (std::is_same_v<T, std::string>) return value.empty() ? "" : code(value);
  else if constexpr (std::is_same_v<T, std::chrono::nanoseconds>) return duration_text(value);
  else return "";
}

// The library's Options: defaults read from a default Options.
std::string options_table() {
  std::string out = "| option | flag | default | unit | rule | meaning |\n|---|---|---|---|---|---|\n";
  describe::for_each_field(pgmutex::Options{}, [&](const describe::Field& field, const auto& value) {
    const std::string flag = field.flag.starts_with("--") ? code(field.flag) : "";
    out += "| " + code(field.name) + " | " + flag + " | " + default_of(field, value) + " | " + std::string(field.unit) +
           " | " + std::string(field.rule) +
           " | " + std::string(field.doc) + " |\n";
  });
  return out;
}

// `status`: a record's text columns and JSON keys (a lock, or a waiter in its queue).
template <class Record>
std::string status_table() {
  std::string out = "| JSON key | column | meaning |\n|---|---|---|\n";
  for (const describe::Field& field : describe::Description<Record>::fields) {
    std::string column(field.column.empty() ? describe::key_of(field) : field.column);
    for (char& c : column) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    out += "| " + code(describe::key_of(field)) + " | " + code(column) + " | " + std::string(field.doc) + " |\n";
  }
  return out;
}

std::string labels_of(std::span<const describe::Field> fields) {
  std::string labels;
  for (const describe::Field& field : fields)
    if (!field.label.empty() && field.metric.empty()) labels += (labels.empty() ? "" : ",") + std::string(field.label);
  return labels;
}

// A described record's metrics: name with its labels, type, meaning.
template <class Record>
std::string metrics_table(std::span<const describe::Field> extra = {}, std::string fixed_labels = {}) {
  const auto& fields = describe::Description<Record>::fields;
  const std::string labels = fixed_labels.empty() ? labels_of(fields) : fixed_labels;
  std::string out = "| metric | type | meaning |\n|---|---|---|\n";
  const auto row = [&](const describe::Field& field) {
    if (field.metric.empty()) return;
    std::string all = labels;
    if (!field.label.empty()) all += "," + std::string(field.label);
    out += "| " + code(std::string(field.metric) + "{" + all + "}") + " | " + std::string(field.metric_type) + " | " +
           std::string(field.doc) + " |\n";
  };
  for (const describe::Field& field : extra) row(field);
  for (const describe::Field& field : fields) row(field);
  return out;
}

// A subcommand's flags, as the command registers them: names, value, default, help.
std::string flags_table(const std::string& subcommand) {
  CLI::App app;
  if (subcommand == "run") (void)pgmutex::cli::add_run_command(app);
  else if (subcommand == "elect") (void)pgmutex::cli::add_elect_command(app);
  else (void)pgmutex::cli::add_status_command(app);
  std::string out = "| flag | default | meaning |\n|---|---|---|\n";
  for (const CLI::Option* option : app.get_subcommand(subcommand)->get_options()) {
    if (option->get_name() == "--help" || option->get_positional()) continue;
    std::string names;
    for (const std::string& name : option->get_snames()) names += (names.empty() ? "" : ", ") + code("-" + name);
    for (const std::string& name : option->get_lnames()) {
      const std::string value = option->get_type_name().empty() || option->get_type_name().find(':') == 0
                                    ? ""
                                    : " " + option->get_type_name().substr(0, option->get_type_name().find(':'));
      names += (names.empty() ? "" : ", ") + code("--" + name + value);
    }
    std::string fallback = option->get_required() ? "required" : option->get_default_str();
    if (fallback.empty()) fallback = option->get_type_name().empty() ? "off" : "none";
    if (!option->get_envname().empty()) fallback += ", or $" + option->get_envname();
    out += "| " + names + " | " + fallback + " | " + option->get_description() + " |\n";
  }
  return out;
}

const std::map<std::string, std::function<std::string()>>& tables() {
  static const std::map<std::string, std::function<std::string()>> all = {
      {"options", options_table},
      {"run-flags", [] { return flags_table("run"); }},
      {"elect-flags", [] { return flags_table("elect"); }},
      {"status-flags", [] { return flags_table("status"); }},
      {"status", status_table<pgmutex::cli::LockStatus>},
      {"status-queue", status_table<pgmutex::cli::WaiterStatus>},
      {"status-leaders", status_table<pgmutex::cli::LeaderStatus>},
      {"status-metrics",
       [] {
         return metrics_table<pgmutex::cli::LockStatus>(
                    std::span(&describe::Description<pgmutex::cli::LockStatus>::held, 1)) +
                metrics_table<pgmutex::cli::WaiterStatus>().substr(std::string_view("| metric | type | meaning |\n|---|---|---|\n").size());
       }},
      {"run-metrics", [] { return metrics_table<pgmutex::cli::RunReport>(); }},
      {"library-metrics", [] { return metrics_table<pgmutex::LockMetrics>({}, "lock"); }},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "--list";
  if (what == "--list") {
    for (const auto& [name, table] : tables()) std::printf("%s\n", name.c_str());
    return 0;
  }
  const auto found = tables().find(what);
  if (found == tables().end()) {
    std::fprintf(stderr, "describe_tables: no table '%s' (see --list)\n", what.c_str());
    return 2;
  }
  std::fputs(found->second().c_str(), stdout);
  return 0;
}
