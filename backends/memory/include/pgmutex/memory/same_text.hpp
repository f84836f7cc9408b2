// detail::same_text: the string comparison on the in-memory backend's hot
// path (lock names, table names, instance ids). Not part of the API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "pgmutex/detail/light_mutex.hpp"

namespace pgmutex {

namespace detail {

// Whether two strings have the same contents. Lock names, table names and
// instance ids are short: up to 16 bytes compare in two overlapping loads
// each, without a call to memcmp.
PGMUTEX_ALWAYS_INLINE bool same_text(std::string_view a, std::string_view b) noexcept {
  const std::size_t n = a.size();
  if (n != b.size()) return false;
  const char* x = a.data();
  const char* y = b.data();
  const auto load8 = [](const char* p) { std::uint64_t v; std::memcpy(&v, p, sizeof v); return v; };
  const auto load4 = [](const char* p) { std::uint32_t v; std::memcpy(&v, p, sizeof v); return v; };
  if (n >= 8) {
    if (n > 16) return std::memcmp(x, y, n) == 0;
    return ((load8(x) ^ load8(y)) | (load8(x + n - 8) ^ load8(y + n - 8))) == 0;
  }
  if (n >= 4) return ((load4(x) ^ load4(y)) | (load4(x + n - 4) ^ load4(y + n - 4))) == 0;
  if (n == 0) return true;
  return x[0] == y[0] && x[n / 2] == y[n / 2] && x[n - 1] == y[n - 1];  // n is 1, 2 or 3: every byte
}

}  // namespace detail

}  // namespace pgmutex
