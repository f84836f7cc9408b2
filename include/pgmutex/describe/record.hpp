// Walking a described record: its fields' names from the Hana adaptation,
// matched with the words of its Description. Include this where a record's
// fields are turned into flags, keys, metrics or docs, never in a hot header.
#pragma once

#include <cstddef>
#include <string_view>
#include <type_traits>

#include <boost/hana/accessors.hpp>
#include <boost/hana/at.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/string.hpp>
#include <boost/hana/tuple.hpp>

#include "pgmutex/describe/field.hpp"

namespace pgmutex::describe {

namespace hana = boost::hana;

template <class Record>
constexpr std::size_t field_count = decltype(hana::length(hana::accessors<Record>()))::value;

// True if the Description names exactly the adapted members, in order.
template <class Record>
constexpr bool description_matches() {
  constexpr auto& fields = Description<Record>::fields;
  if (fields.size() != field_count<Record>) return false;
  bool ok = true;
  std::size_t i = 0;
  hana::for_each(hana::accessors<Record>(), [&](auto pair) {
    ok = ok && fields[i].name == std::string_view(hana::to<char const*>(hana::first(pair)));
    ++i;
  });
  return ok;
}

// f(field, value) for every member of `record`, with its Field.
template <class Record, class F>
constexpr void for_each_field(Record&& record, F&& f) {
  using R = std::remove_cvref_t<Record>;
  static_assert(description_matches<R>(), "the Description's fields must name the adapted members, in order");
  std::size_t i = 0;
  hana::for_each(hana::accessors<R>(), [&](auto pair) {
    f(Description<R>::fields[i], hana::second(pair)(record));
    ++i;
  });
}

// The Field of one member, found by its address in a probe object.
template <class Record, class T>
const Field& field_of(T Record::*member) {
  static const Record probe{};
  const void* wanted = &(probe.*member);
  const Field* found = nullptr;
  for_each_field(probe, [&](const Field& field, const auto& value) {
    if (static_cast<const void*>(&value) == wanted) found = &field;
  });
  return *found;  // every member of an adapted record is described (static_assert above)
}

// The key a field has in JSON and metrics: `key`, else its name.
constexpr std::string_view key_of(const Field& field) { return field.key.empty() ? field.name : field.key; }

}  // namespace pgmutex::describe
