// A described record as Prometheus metrics: every field the description
// gives a metric becomes one family (# HELP from its doc, # TYPE), with a
// sample per record, labelled by the fields the description makes labels.
// An enum field becomes one sample per value, labelled with the value: 1 for
// the record's, 0 for the others (found by ADL: all_values(E{}), to_string(E)).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "pgmutex/describe/record.hpp"
#include "pgmutex/metrics/exposition.hpp"

namespace pgmutex::cli {

template <class Record>
std::string label_text(const Record& record, std::string_view extra_name = {}, std::string_view extra_value = {}) {
  std::string text;
  const auto add = [&](std::string_view name, std::string_view value) {
    text.append(text.empty() ? "" : ",").append(name).append("=\"").append(exposition::escape_label(value)).append("\"");
  };
  describe::for_each_field(record, [&](const describe::Field& field, const auto& value) {
    if constexpr (std::is_convertible_v<decltype(value), std::string_view>) {
      if (!field.label.empty() && field.metric.empty()) add(field.label, value);
    } else if constexpr (std::is_integral_v<std::remove_cvref_t<decltype(value)>>) {
      if (!field.label.empty() && field.metric.empty()) add(field.label, std::to_string(value));
    }
  });
  if (!extra_name.empty()) add(extra_name, extra_value);
  return "{" + text + "}";
}

template <class Record>
void write_metrics(std::string& out, std::span<const Record> records) {
  for (const describe::Field& field : describe::Description<Record>::fields) {
    if (field.metric.empty()) continue;
    exposition::family(out, field.metric, field.metric_type, field.doc);
    for (const Record& record : records) {
      describe::for_each_field(record, [&](const describe::Field& member, const auto& value) {
        if (&member != &field) return;
        using T = std::remove_cvref_t<decltype(value)>;
        if constexpr (std::is_enum_v<T>) {
          for (const T each : all_values(T{}))
            exposition::sample(out, field.metric, label_text(record, field.label, to_string(each)), each == value ? 1 : 0);
        } else if constexpr (std::is_arithmetic_v<T>) {
          exposition::sample(out, field.metric, label_text(record), static_cast<double>(value));
        }
      });
    }
  }
}

}  // namespace pgmutex::cli
