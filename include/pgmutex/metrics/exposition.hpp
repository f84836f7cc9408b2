// The Prometheus text exposition format (version 0.0.4), written by hand:
// `# HELP` and `# TYPE` lines, escaped label values, and numbers as
// Prometheus parses them. Used by PrometheusMetrics and by the command's
// `status --format prometheus` and `run --metrics-file`.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace pgmutex::exposition {

// A label value with \, " and newline escaped, as the format demands.
inline std::string escape_label(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// HELP text: only \ and newline are escaped.
inline std::string escape_help(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// Integers exactly, others with enough digits to read back; +Inf, -Inf, NaN by name.
inline std::string number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[40];
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(buffer, sizeof buffer, "%.0f", value);
    return buffer;
  }
  // The shortest that reads back as the same double: 0.0025, not 0.0025000000000000001.
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buffer, sizeof buffer, "%.*g", digits, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

using Labels = std::initializer_list<std::pair<std::string_view, std::string_view>>;

// {a="x",b="y"}, or nothing for no labels.
inline std::string labels(Labels pairs) {
  if (pairs.size() == 0) return {};
  std::string out = "{";
  for (const auto& [name, value] : pairs) {
    if (out.size() > 1) out += ',';
    out.append(name).append("=\"").append(escape_label(value)).append("\"");
  }
  return out + "}";
}

// # HELP and # TYPE of one metric family; each family once, before its samples.
inline void family(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out.append("# HELP ").append(name).append(" ").append(escape_help(help)).append("\n");
  out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

inline void sample(std::string& out, std::string_view name, const std::string& label_text, double value) {
  out.append(name).append(label_text).append(" ").append(number(value)).append("\n");
}

}  // namespace pgmutex::exposition
