// Using PostgresBackend with your own connection pool. The only pgmutex header
// that includes libpqxx: include it only where you hand the backend a pool.
//
//   struct MyPool {
//     pqxx::connection& borrow();                      // hand out an idle connection (may throw)
//     void give_back(pqxx::connection& c) noexcept;    // take it back (check c.is_open())
//   };
//   MyPool pool = ...;                                 // owned by you; must outlive the backend
//   pgmutex::Mutex mutex(pgmutex::make_pooled_backend(pool), options);
//
// The backend borrows one connection per operation and gives it back at the
// end of that operation; it never opens or closes the pool. It prepares its
// statements on each connection it is given (once per connection and table)
// and leaves no session state behind except those prepared statements.
//
// What a borrowed connection cannot bound: libpqxx 6's calls block, so only
// the server ends them. Every statement that may wait for a row lock carries
// lock_timeout (half the operation's timeout, set inside the statement), but
// statement_timeout is not set (it would stay on your connection as session
// state), and a frozen server (TCP open, nothing answered) blocks the call
// until the connection's own TCP settings (tcp_user_timeout, keepalives) give
// up, or for ever if they are off. Set them in your pool's DSN; a backend that
// owns its connection has none of these limits.
#pragma once

#include <concepts>
#include <memory>
#include <utility>

#include <pqxx/connection>

#include "pgmutex/postgres_backend.hpp"

namespace pgmutex {

class ConnectionSource {
 public:
  ConnectionSource() = default;
  ConnectionSource(const ConnectionSource&) = delete;
  ConnectionSource& operator=(const ConnectionSource&) = delete;
  virtual ~ConnectionSource() = default;

  virtual pqxx::connection& borrow() = 0;
  virtual void give_back(pqxx::connection& connection) noexcept = 0;
};

template <class P>
concept ConnectionPool = requires(P& pool, pqxx::connection& connection) {
  { pool.borrow() } -> std::same_as<pqxx::connection&>;
  { pool.give_back(connection) };
};

template <ConnectionPool P>
class PoolConnectionSource final : public ConnectionSource {
 public:
  explicit PoolConnectionSource(P& pool) noexcept : pool_(&pool) {}
  pqxx::connection& borrow() override { return pool_->borrow(); }
  void give_back(pqxx::connection& connection) noexcept override {
    try {
      pool_->give_back(connection);
    } catch (...) {  // a pool that throws here must not break the lock
    }
  }

 private:
  P* pool_;
};

// A backend over `pool` (by reference: the pool must outlive the backend).
template <ConnectionPool P>
PostgresBackend make_pooled_backend(P& pool, PostgresOptions options = {}) {
  return PostgresBackend(std::make_shared<PoolConnectionSource<P>>(pool), std::move(options));
}

}  // namespace pgmutex
