// What a record's description says about each of its fields: the words that
// the flags, JSON keys, metrics, error messages and the README tables are
// made from. Plain data, no Boost: the Hana adaptation that ties a field to
// its member lives in the record's own describe/ header.
#pragma once

#include <string_view>

namespace pgmutex::describe {

struct Field {
  std::string_view name;               // the member's name, checked against the Hana adaptation
  std::string_view doc;                // one line: what it is
  std::string_view unit = {};          // "seconds", "" for none
  std::string_view flag = {};          // the command line's flag ("--lock"), or its words if no flag has it
  std::string_view default_text = {};  // how the default reads in docs; empty: derived from the value
  std::string_view rule = {};          // what validate() demands of it
  std::string_view key = {};           // JSON key or metric suffix; empty: the name
  std::string_view column = {};        // a text table's column header; empty: the key in capitals
  std::string_view metric = {};        // the Prometheus metric it is exported as, if any
  std::string_view metric_type = {};   // "gauge", "counter", "histogram"
  std::string_view label = {};         // the Prometheus label it is exported as, if any
};

}  // namespace pgmutex::describe

namespace pgmutex::describe {

// Specialized next to each described record: `static constexpr std::array<Field, N> fields`,
// in the order of the record's Hana adaptation (a static_assert there checks it).
template <class Record>
struct Description;

}  // namespace pgmutex::describe
