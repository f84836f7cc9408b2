// What a PostgresBackend whose statements run on a pgmutex::Session's
// connection needs of that session, and what the session reaches inside
// PostgresBackend (a friend). Kept apart from session_core.hpp so the
// backend's operations need not see the public Session. Private to the backend.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "own_session.hpp"
#include "pgmutex/postgres_backend.hpp"

namespace pgmutex::postgres_detail {

// The server history of one mutex's last synchronously committed write (its
// acquire, or a durable heartbeat). With a shared connection the
// connection-wide "durable heartbeat due" flag of ServerHistory cannot serve:
// one lock's durable heartbeat would vouch for another's after a failover.
// A mutex's heartbeat is durable iff the session's history differs from this.
struct DurableMark {
  static constexpr std::uint64_t none = ~std::uint64_t{0};
  std::atomic<std::uint64_t> history{none};
  [[nodiscard]] bool due(std::uint64_t current) const noexcept { return history.load() != current; }
};

class SharedConnection {
 public:
  SharedConnection() = default;
  SharedConnection(const SharedConnection&) = delete;
  SharedConnection& operator=(const SharedConnection&) = delete;
  virtual ~SharedConnection() = default;

  // Runs `body` on the connection's thread and waits for it. False if
  // `queued_until` passed while it was still queued (it then never runs) or
  // the session stopped. A running body is waited for: it has its own deadline.
  virtual bool call(const std::function<void(OwnSession&)>& body, Deadline queued_until) = 0;
  [[nodiscard]] virtual const PostgresOptions& postgres_options() const noexcept = 0;
  [[nodiscard]] virtual const std::string& redacted() const noexcept = 0;
  [[nodiscard]] virtual const std::vector<std::string>& secrets() const noexcept = 0;
};

struct SharedAccess {
  static PostgresBackend make(std::shared_ptr<SharedConnection> shared, std::shared_ptr<DurableMark> mark);
  // heartbeat_many, committed synchronously if `durable` (else as the options
  // say); with `skip_locked`, a row another transaction locked is reported
  // false instead of waited for.
  static Result<std::vector<bool>> heartbeat_many(PostgresBackend& backend, std::span<const HolderKey> keys,
                                                  bool durable, bool skip_locked) noexcept;
  // The lock's NOTIFY channel (with `suffix`: "_e", its election's),
  // LISTENed on the shared connection.
  static Result<std::string> listen(PostgresBackend& backend, LockRef lock, std::string_view suffix = {}) noexcept;
  // A release offered the Session's place `ticket` the lock (its I/O thread
  // heard it): the waiter's next queued try is the lean confirm (queue_waits.cpp).
  static void offered(PostgresBackend& backend, std::int64_t ticket) noexcept;
  // When the place `ticket` should look at a head that may let its offer
  // lapse, as the last queued try on `backend` found (backend_operations.cpp:
  // watch_the_head), once: the Session's waiter arms its place with it.
  static std::optional<std::chrono::steady_clock::time_point> take_probe(PostgresBackend& backend,
                                                                         std::int64_t ticket) noexcept;
  // Whether the place `ticket` that `backend` just took is kept alive by a
  // lease (no server pid bound it: a pooler in front) rather than by its
  // connection's server backend: then only its looks renew it.
  static bool lease_kept(PostgresBackend& backend, std::int64_t ticket) noexcept;
};

}  // namespace pgmutex::postgres_detail
