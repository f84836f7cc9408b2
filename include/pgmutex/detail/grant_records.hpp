// The small records that pass between a mutex's units: where a statement
// was answered (ServerSession: the lock statements to the grant book) and
// what must be told when a lease ends by loss (LostNotice: the grant book
// to the lease timer and the coordinator). Not part of the API.
#pragma once

#include <cstdint>
#include <optional>
#include <stop_token>

#include "pgmutex/backend.hpp"
#include "pgmutex/error.hpp"

namespace pgmutex::detail {

// What the world must be told after a lease ended by loss: the stop_source
// to stop and the reason for the `lost` hook. Delivered outside every lock.
struct LostNotice {
  std::optional<std::stop_source> stop;
  Error reason;
};

// Where a statement was answered: the server session (another after a
// reconnect or a restart) and the server history (another after a failover
// to a standby, or on another cluster: see BackendReportsHistory); for a
// heartbeat, how it was committed (see BackendReportsDurability).
struct ServerSession {
  std::uint64_t session = 0;
  std::uint64_t history = 0;
  HeartbeatDurability durability{};
};

}  // namespace pgmutex::detail
