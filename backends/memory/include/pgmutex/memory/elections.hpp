// A lock's election in the in-memory server: the same rules as the Postgres
// backend's election_sql.cpp (issue 18), written once for MemoryBackend. The
// term is the holder's fence; change counts every announcement of the lock
// (elected, proclaimed, vacated) and outlives vacancies.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "pgmutex/backend.hpp"

namespace pgmutex::detail {

struct ElectionEntry {
  Fence term = 0;
  std::int64_t change = 0;
  bool announced = false;
  std::string value, instance_id, host;
  std::chrono::nanoseconds since{};  // server time the term began
};

// The holder of `term` announces `value`: a higher term is elected, the same
// term (not vacated) with another value proclaimed; anything else changes
// nothing (a retry, a vacated term). True if the entry changed.
inline bool announce_term(ElectionEntry& e, Fence term, std::string_view value, std::string_view instance_id,
                          std::string_view host, std::chrono::nanoseconds now) {
  if (e.term < term) {
    e.term = term;
    e.since = now;
    e.instance_id = instance_id;
    e.host = host;
  } else if (e.term != term || !e.announced || e.value == value) {
    return false;
  }
  ++e.change;
  e.announced = true;
  e.value = value;
  return true;
}

// The holder of `term` gives it up. True if the entry changed.
inline bool vacate_term(ElectionEntry& e, Fence term) {
  if (e.term != term || !e.announced) return false;
  e.announced = false;
  ++e.change;
  return true;
}

}  // namespace pgmutex::detail
