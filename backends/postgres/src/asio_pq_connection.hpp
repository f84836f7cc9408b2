// One libpq connection driven by Asio: the asynchronous counterpart of
// PqConnection (pq_connection.hpp), and the engine the coming AsioMutex and
// Session are built on. Private to the backend; with asio_pq_engine.hpp, the
// only backend headers that include Asio.
//
// The protocol steps are written once, as a non-template resumable algorithm
// (PqEngine, asio_pq_engine.hpp): each step calls libpq's non-blocking API and says
// what it waits for next (read, write, either, or done). One composed
// operation template (PqIoOp) drives it with Asio: it waits on the socket and
// on the operation's deadline at once, and it works with every completion
// token (callbacks, use_future, use_awaitable, deferred) through
// asio::async_compose.
//
// Rules, as in the blocking engine:
//  - every operation ends by its deadline. A statement whose deadline passes
//    or that is cancelled (terminal cancellation through the handler's
//    cancellation slot) may still run on the server: a PQcancel is sent off
//    the event loop (pq_cancel.hpp) and the connection is discarded. A
//    notification wait has nothing in flight: its deadline gives `false`, its
//    cancellation operation_aborted, and the connection stays usable;
//  - Asio never closes libpq's socket: it is released from the descriptor
//    before PQfinish, and re-wrapped after every PQconnectPoll (libpq may
//    replace it, possibly by a new socket with the same number);
//  - NOTIFYs are drained after every read and kept per channel.
//
// One operation at a time per connection (like Boost.MySQL's connection): a
// second one started meanwhile completes with PqErrc::busy. Use it from one
// thread or strand. Destroying the connection while an operation is pending
// completes that operation with operation_aborted.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/compose.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/posix/descriptor_base.hpp>
#include <boost/asio/post.hpp>

#include "asio_pq_engine.hpp"

namespace pgmutex::postgres_detail {

namespace asio_pq_detail {

namespace asio = boost::asio;

// Drives one PqEngine algorithm: each wait is a parallel group of the socket
// wait(s) and the deadline timer, so a deadline or a cancellation ends it.
// R is what the operation completes with after its error code (void: nothing).
template <class R, class Start>
class PqIoOp {
 public:
  PqIoOp(std::shared_ptr<PqEngine> engine, AsioDeadline deadline, Start start)
      : engine_(std::move(engine)), deadline_(deadline), start_(std::move(start)) {}

  template <class Self>
  void operator()(Self& self) {
    switch (stage_) {
      case Stage::initial:
        break;
      case Stage::complete_posted:  // completes outside the initiating function
        return finish(self, posted_error_);
    }
    if (engine_->busy) return post_completion(self, PqErrc::busy, false);
    if (engine_->closed()) return post_completion(self, asio::error::operation_aborted, false);
    owns_engine_ = true;
    engine_->busy = true;
    engine_->timer.expires_at(deadline_);
    const PqWant want = start_(*engine_);
    if (want == PqWant::done) return post_completion(self, engine_->error(), true);
    wait(self, want);
  }

  // A wait for one direction: {socket, timer}.
  template <class Self>
  void operator()(Self& self, std::array<std::size_t, 2> order, boost::system::error_code socket_ec,
                  boost::system::error_code timer_ec) {
    after_wait(self, order[0] == 1, socket_ec, timer_ec);
  }

  // A wait for read or write: {read, write, timer}.
  template <class Self>
  void operator()(Self& self, std::array<std::size_t, 3> order, boost::system::error_code read_ec,
                  boost::system::error_code write_ec, boost::system::error_code timer_ec) {
    after_wait(self, order[0] == 2, order[0] == 0 ? read_ec : write_ec, timer_ec);
  }

 private:
  enum class Stage { initial, complete_posted };

  template <class Self>
  void post_completion(Self& self, boost::system::error_code ec, bool owns) {
    stage_ = Stage::complete_posted;
    posted_error_ = ec;
    owns_engine_ = owns;
    asio::post(std::move(self));
  }

  template <class Self>
  void wait(Self& self, PqWant want) {
    using asio::experimental::make_parallel_group;
    using asio::experimental::wait_for_one;
    using Wait = asio::posix::descriptor_base::wait_type;
    auto& socket = engine_->socket;
    auto& timer = engine_->timer;
    switch (want) {
      case PqWant::done:
        return finish(self, engine_->error());
      case PqWant::read:
      case PqWant::write:
        make_parallel_group(
            socket.async_wait(want == PqWant::read ? Wait::wait_read : Wait::wait_write, asio::deferred),
            timer.async_wait(asio::deferred))
            .async_wait(wait_for_one(), std::move(self));
        return;
      case PqWant::read_or_write:
        make_parallel_group(socket.async_wait(Wait::wait_read, asio::deferred),
                            socket.async_wait(Wait::wait_write, asio::deferred), timer.async_wait(asio::deferred))
            .async_wait(wait_for_one(), std::move(self));
        return;
    }
  }

  template <class Self>
  void after_wait(Self& self, bool timer_first, boost::system::error_code socket_ec,
                  boost::system::error_code timer_ec) {
    if (engine_->closed() || self.get_cancellation_state().cancelled() != asio::cancellation_type::none) {
      engine_->cancelled();
      return finish(self, asio::error::operation_aborted);
    }
    if (timer_first && !timer_ec) {
      engine_->deadline_passed();
      return finish(self, engine_->error());
    }
    if (socket_ec) {
      engine_->wait_failed(socket_ec);
      return finish(self, engine_->error());
    }
    wait(self, engine_->resume());
  }

  template <class Self>
  void finish(Self& self, boost::system::error_code ec) {
    if (owns_engine_) {
      engine_->busy = false;
      engine_->end_operation();
    }
    if constexpr (std::is_void_v<R>) {
      self.complete(ec);
    } else if constexpr (std::is_same_v<R, Rows>) {
      self.complete(ec, owns_engine_ ? engine_->take_rows() : Rows{});
    } else if constexpr (std::is_same_v<R, bool>) {
      self.complete(ec, owns_engine_ && engine_->take_notified());
    } else {
      self.complete(ec, owns_engine_ ? engine_->take_results() : R{});
    }
  }

  std::shared_ptr<PqEngine> engine_;
  AsioDeadline deadline_;
  Start start_;
  Stage stage_ = Stage::initial;
  bool owns_engine_ = false;
  boost::system::error_code posted_error_;
};

}  // namespace asio_pq_detail

class AsioPqConnection {
 public:
  using executor_type = boost::asio::any_io_executor;

  explicit AsioPqConnection(const executor_type& executor) : engine_(std::make_shared<PqEngine>(executor)) {}
  AsioPqConnection(AsioPqConnection&&) noexcept = default;
  AsioPqConnection& operator=(AsioPqConnection&& other) noexcept {
    if (this != &other) {
      if (engine_) engine_->close();
      engine_ = std::move(other.engine_);
    }
    return *this;
  }
  AsioPqConnection(const AsioPqConnection&) = delete;
  AsioPqConnection& operator=(const AsioPqConnection&) = delete;
  ~AsioPqConnection() {
    if (engine_) engine_->close();
  }

  [[nodiscard]] executor_type get_executor() const noexcept { return engine_->executor; }
  // False before a connect, and once the connection broke, timed out or was cancelled: connect again.
  [[nodiscard]] bool usable() const noexcept { return engine_->usable(); }
  // Why the last operation failed (meaningful after an error).
  [[nodiscard]] const StatementFailure& last_failure() const noexcept { return engine_->last_failure(); }
  [[nodiscard]] int backend_pid() const noexcept { return engine_->backend_pid(); }
  [[nodiscard]] const PqIoCounters& counters() const noexcept { return engine_->counters(); }
  // Forgets notifications that already arrived on `channel`.
  void discard_notifications(std::string_view channel) { engine_->discard_notifications(channel); }

  // PQconnectStart / PQconnectPoll. Completion: void(error_code). Discards a previous connection.
  template <class Token>
  auto async_connect(std::string conninfo, AsioDeadline deadline, Token&& token) {
    return compose<void, void(boost::system::error_code)>(
        deadline, [conninfo = std::move(conninfo)](PqEngine& e) { return e.start_connect(conninfo); },
        std::forward<Token>(token));
  }

  // Completion of the statement operations: void(error_code, Rows).
  template <class Token>
  auto async_prepare(std::string name, std::string sql, AsioDeadline deadline, Token&& token) {
    return exchange_one(PqStatement::prepare(std::move(name), std::move(sql)), deadline, std::forward<Token>(token));
  }
  template <class Token>
  auto async_exec_prepared(std::string name, std::vector<std::string> params, AsioDeadline deadline, Token&& token) {
    return exchange_one(PqStatement::prepared(std::move(name), std::move(params)), deadline,
                        std::forward<Token>(token));
  }
  // One statement with parameters (extended protocol, unnamed).
  template <class Token>
  auto async_exec_params(std::string sql, std::vector<std::string> params, AsioDeadline deadline, Token&& token) {
    return exchange_one(PqStatement::with_params(std::move(sql), std::move(params)), deadline,
                        std::forward<Token>(token));
  }

  // All statements sent in libpq's pipeline mode, then all results read: one
  // round trip however many statements. Completion: void(error_code,
  // std::vector<Outcome<Rows>>), one outcome per statement; the error code is
  // for the connection (timeout, cancellation, loss), server errors are per statement.
  template <class Token>
  auto async_pipeline(std::vector<PqStatement> statements, PipelineSync sync, AsioDeadline deadline, Token&& token) {
    return compose<std::vector<Outcome<Rows>>, void(boost::system::error_code, std::vector<Outcome<Rows>>)>(
        deadline,
        [statements = std::move(statements), sync](PqEngine& e) mutable {
          return e.start_exchange(std::move(statements), true, sync);
        },
        std::forward<Token>(token));
  }

  // Waits for a NOTIFY on `channel` from another session (LISTEN first).
  // Completion: void(error_code, bool): true if one came (or had come), false
  // if the deadline passed first; the connection stays usable either way.
  template <class Token>
  auto async_wait_notification(std::string channel, AsioDeadline deadline, Token&& token) {
    return compose<bool, void(boost::system::error_code, bool)>(
        deadline,
        [channel = std::move(channel)](PqEngine& e) mutable { return e.start_notification_wait(std::move(channel)); },
        std::forward<Token>(token));
  }

 private:
  template <class R, class Signature, class Start, class Token>
  auto compose(AsioDeadline deadline, Start start, Token&& token) {
    return boost::asio::async_compose<Token, Signature>(
        asio_pq_detail::PqIoOp<R, Start>(engine_, deadline, std::move(start)), token,
        engine_->executor);
  }

  template <class Token>
  auto exchange_one(PqStatement statement, AsioDeadline deadline, Token&& token) {
    return compose<Rows, void(boost::system::error_code, Rows)>(
        deadline,
        [statement = std::move(statement)](PqEngine& e) mutable {
          std::vector<PqStatement> one;
          one.push_back(std::move(statement));
          return e.start_exchange(std::move(one), false, PipelineSync::once);
        },
        std::forward<Token>(token));
  }

  std::shared_ptr<PqEngine> engine_;
};

}  // namespace pgmutex::postgres_detail
