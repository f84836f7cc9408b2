// How --help lays its text out: wrapped at the terminal's width, and the usage
// line each subcommand gives (CLI11 2.1 builds neither).
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include <CLI/CLI.hpp>

namespace pgmutex::cli {

// The width help is wrapped at: the terminal's (TIOCGWINSZ) when stdout is
// one, else $COLUMNS, else 80; never below 40.
[[nodiscard]] std::size_t help_width();

// `text` with its lines broken at spaces so that none is longer than `width`
// (a word longer than that stays whole); its own line breaks are kept.
[[nodiscard]] std::string wrapped(const std::string& text, std::size_t width);

// CLI11's formatter, with descriptions wrapped to fit `width`, and the usage
// lines given for a subcommand instead of CLI11's generic one.
class HelpFormatter : public CLI::Formatter {
 public:
  explicit HelpFormatter(std::size_t width);
  // `lines`: "pgmutex run --lock NAME ...", one per form, without "Usage: ".
  void set_usage(const std::string& subcommand, std::string lines);

  std::string make_option_desc(const CLI::Option* option) const override;
  std::string make_subcommand(const CLI::App* sub) const override;
  std::string make_description(const CLI::App* app) const override;
  std::string make_usage(const CLI::App* app, std::string name) const override;

 private:
  std::size_t width_;
  std::map<std::string, std::string> usages_;
};

}  // namespace pgmutex::cli
