// detail::WaiterQueue: one lock's line of waiters on a MemoryServer (the
// `<table>_queue` rows of PostgresBackend), in ticket order, with the '' wake-ups
// sent for it. Pure state: the server reads and writes it with its own lock
// held; which connection is alive is the server's to say. Not part of the API.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>

#include "pgmutex/backend.hpp"

namespace pgmutex::detail {

struct Waiter {
  std::int64_t ticket = 0;
  GrantToken token = 0;  // the grant token of the grant it may get
  std::string instance_id;
  std::string connection;  // alive while this connection is (MemoryServer::kill_connection)
  std::chrono::nanoseconds stale_threshold{};
  std::chrono::nanoseconds handoff_deadline{};
  std::string holder_host;  // copied into its grant
  std::int64_t holder_pid = 0;
  std::string holder_command;
  Fence offered_fence = 0;  // a release offered it the lock with this fence (0: not yet)
  std::chrono::nanoseconds offered_until{};
  std::uint64_t seen_freed = 0;  // the lock's '' wake-ups it has looked at
};

struct WaiterQueue {
  std::deque<Waiter> waiters;  // ticket order
  std::uint64_t freed = 0;     // '' wake-ups sent for this lock so far

  Waiter* find(std::int64_t ticket) {
    const auto it = std::ranges::find(waiters, ticket, &Waiter::ticket);
    return it == waiters.end() ? nullptr : &*it;
  }
  // The first `n`-th (0: head) waiter not offered anything and alive.
  template <class Alive>
  Waiter* live(Alive&& alive, int n = 0) {
    for (Waiter& w : waiters)
      if (w.offered_fence == 0 && alive(w) && n-- == 0) return &w;
    return nullptr;
  }
  // The waiter a pending offer of `fence` with `token` went to.
  Waiter* offered(Fence fence, GrantToken token) {
    for (Waiter& w : waiters)
      if (w.offered_fence != 0 && w.offered_fence == fence && w.token == token) return &w;
    return nullptr;
  }
  // Removes the waiters that match; how many.
  template <class Pred>
  std::size_t remove_if(Pred&& pred) {
    const auto before = waiters.size();
    std::erase_if(waiters, pred);
    return before - waiters.size();
  }
};

}  // namespace pgmutex::detail
