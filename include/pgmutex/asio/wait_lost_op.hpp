// async_wait_lost: completes when the grant's lease is lost, told by the
// grant's std::stop_token (the watchdog and a heartbeat that finds the row
// gone both stop it), or with operation_aborted when its cancellation slot
// fires. Whichever comes first wins (`done_`); the other finds nothing to do.
// The token is stopped off the user's loop (the lease deadline is on the timer
// thread), so only the completion is posted there: it runs as soon as the
// loop runs again, however long a handler kept it busy.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <utility>

#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/error.hpp>

#include "pgmutex/asio/completion.hpp"

namespace pgmutex::asio_detail {

template <class Handler>
class WaitLostOp : public std::enable_shared_from_this<WaitLostOp<Handler>> {
 public:
  WaitLostOp(Handler handler, const boost::asio::any_io_executor& loop) : completion_(std::move(handler), loop) {}

  // The op keeps itself (self_) until it completes: nothing else refers to
  // it while the lease holds and no slot is connected.
  void start(std::stop_token lost) {
    std::lock_guard lock(m_);
    self_ = this->shared_from_this();
    if (auto slot = completion_.cancellation_slot(); slot.is_connected())
      slot.assign([this](boost::asio::cancellation_type type) {
        if (type != boost::asio::cancellation_type::none) end(boost::asio::error::operation_aborted);
      });
    // Runs here at once if the lease is already lost. The callback holds no
    // reference: the op outlives it (the callback is its member).
    on_lost_.emplace(std::move(lost), Ended{this});
  }

 private:
  struct Ended {
    WaitLostOp* op;
    void operator()() const noexcept { op->end({}); }
  };

  void end(boost::system::error_code ec) {
    if (done_.exchange(true, std::memory_order_acq_rel)) return;
    // Off whatever thread ran this (a stop callback runs on the thread that
    // declares the loss): the callback is unregistered on the loop, where
    // its destructor may wait for a running callback without deadlock.
    auto self = std::move(self_);
    boost::asio::post(completion_.executor(), [self, ec]() mutable {
      std::lock_guard lock(self->m_);  // start() is done
      self->on_lost_.reset();
      self->completion_.complete(ec);
    });
  }

  Completion<Handler> completion_;
  std::optional<std::stop_callback<Ended>> on_lost_;
  std::mutex m_;  // start() against the completion
  std::atomic<bool> done_{false};
  std::shared_ptr<WaitLostOp> self_;
};

}  // namespace pgmutex::asio_detail
