// wait_for_release without LISTEN (unnamed statements, behind a transaction
// pooler): the row is read with backoff until it is gone or another grant
// holds it. The backoff of one lock carries on over its waits while its
// holder stays the same. Private to the backend.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "pgmutex/backend.hpp"
#include "session.hpp"
#include "sql.hpp"

namespace pgmutex::postgres_detail {

class ReleasePolls {
 public:
  // The first read this long into the wait, each next one twice as long
  // after the last, up to max_poll.
  static constexpr std::chrono::nanoseconds first_poll = std::chrono::milliseconds(25);
  static constexpr std::chrono::nanoseconds max_poll = std::chrono::seconds(1);
  // Locks whose backoff is remembered; past that, all are forgotten.
  static constexpr std::size_t max_polled_locks = 256;

  // Reads the row (each read bounded by `read_timeout`) until it is gone or
  // another grant holds it (true), or `wait_until` (false).
  Outcome<bool> wait(Session& session, const TableStatements& st, LockRef lock_ref, Deadline wait_until,
                     std::chrono::nanoseconds read_timeout);

 private:
  // The holder last seen and the backoff reached.
  struct Poll {
    std::string instance;
    Fence fence = 0;
    std::chrono::nanoseconds delay = first_poll;
  };
  std::map<std::string, Poll, std::less<>> polls_;  // by table, '\0', lock name
};

}  // namespace pgmutex::postgres_detail
