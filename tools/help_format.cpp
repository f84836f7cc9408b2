// The layout of --help (help_format.hpp): wrapped at the terminal's width, one
// usage line per subcommand.
#include "help_format.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <utility>

namespace pgmutex::cli {

std::size_t help_width() {
  constexpr std::size_t narrowest = 40;
  std::size_t width = 80;
  winsize size{};
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    width = size.ws_col;
  } else if (const char* columns = std::getenv("COLUMNS"); columns != nullptr && *columns != '\0') {
    char* end = nullptr;
    const long value = std::strtol(columns, &end, 10);
    if (*end == '\0' && value > 0) width = static_cast<std::size_t>(value);
  }
  return std::max(width, narrowest);
}

std::string wrapped(const std::string& text, std::size_t width) {
  std::string out;
  std::istringstream lines(text);
  bool first_line = true;
  for (std::string line; std::getline(lines, line);) {
    if (!first_line) out += '\n';
    first_line = false;
    std::size_t column = 0;
    std::istringstream words(line);
    for (std::string word; words >> word;) {
      if (column > 0 && column + 1 + word.size() > width) {
        out += '\n';
        column = 0;
      } else if (column > 0) {
        out += ' ';
        ++column;
      }
      out += word;
      column += word.size();
    }
  }
  return out;
}

HelpFormatter::HelpFormatter(std::size_t width) : width_(width) {}

void HelpFormatter::set_usage(const std::string& subcommand, std::string lines) {
  usages_[subcommand] = std::move(lines);
}

// What is left of the line once CLI11 has padded the flag names to the column.
std::string HelpFormatter::make_option_desc(const CLI::Option* option) const {
  const std::size_t column = get_column_width();
  return wrapped(CLI::Formatter::make_option_desc(option), width_ > column + 20 ? width_ - column : 20);
}

std::string HelpFormatter::make_subcommand(const CLI::App* sub) const {
  const std::size_t column = get_column_width();
  std::stringstream out;
  CLI::detail::format_help(out, sub->get_display_name(true),
                           wrapped(sub->get_description(), width_ > column + 20 ? width_ - column : 20), column);
  return out.str();
}

std::string HelpFormatter::make_description(const CLI::App* app) const {
  const std::string description = CLI::Formatter::make_description(app);
  return description.empty() ? description : wrapped(description, width_) + "\n";
}

std::string HelpFormatter::make_usage(const CLI::App* app, std::string name) const {
  const auto found = usages_.find(app->get_name());
  if (found == usages_.end()) return CLI::Formatter::make_usage(app, std::move(name));
  std::string out;
  std::istringstream lines(found->second);
  bool first = true;
  for (std::string line; std::getline(lines, line); first = false) out += (first ? "Usage: " : "       ") + line + "\n";
  return out;
}

}  // namespace pgmutex::cli
