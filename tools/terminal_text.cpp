// Text for a terminal or a log with its control characters made visible, so no
// name can forge a line (terminal_text.hpp).
#include "terminal_text.hpp"

#include <cstdio>

namespace pgmutex::cli {
namespace {

bool is_caret_line(std::string_view line) { return line.find_first_not_of(" \t^") == std::string_view::npos; }

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

}  // namespace

std::string shown(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    char buffer[8];
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7f) {
      std::snprintf(buffer, sizeof buffer, "\\x%02x", c);
      out += buffer;
    } else if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      // U+0080..U+009F: C1 controls; U+009B alone starts an escape sequence in some terminals.
      std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned char>(text[++i]));
      out += buffer;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string one_line(std::string_view message) {
  std::string joined;
  std::size_t start = 0;
  while (start <= message.size()) {
    const auto end = message.find('\n', start);
    const std::string_view line = message.substr(start, end == std::string_view::npos ? end : end - start);
    start = end == std::string_view::npos ? message.size() + 1 : end + 1;
    const std::string_view text = trim(line);
    if (text.empty() || text.starts_with("LINE ") || is_caret_line(text)) continue;
    if (!joined.empty()) joined.push_back(' ');
    joined += text;
  }
  for (char& c : joined)
    if (c == '\t') c = ' ';
  return shown(joined);
}

}  // namespace pgmutex::cli
