// The async forms of BasicMutex and BasicGuard, for AsioExecutor. Each takes
// an Asio completion token (a callback, use_future, use_awaitable, deferred,
// ...) and completes with boost::system::error_code first:
//
//   async_create_schema          void(error_code)
//   async_try_acquire            void(error_code, Guard)
//   async_acquire(timeout)       void(error_code, Guard)   (acquire_op.hpp)
//   guard.async_release          void(error_code)
//   guard.async_heartbeat        void(error_code)
//   guard.async_wait_lost        void(error_code)          (wait_lost_op.hpp)
//   async_singleton(fn)(token)   void(exception_ptr, ran)  (singleton_op.hpp)
//
// An empty guard (the lock held by another, a timeout) is an answer, not an
// error, as in the blocking API: only a backend failure is an error code.
// So is a lost lease at release: async_release of a guard whose lease was
// lost completes with success (nothing is left to release, and the loss
// was told already: lost(), the stop token, async_wait_lost, the lost
// hook), so that a coroutine that releases goes on, under use_awaitable and
// detached alike. Read guard.lost() before the call to know. The blocking
// release(nothrow) still returns Errc::lock_not_held for it, its documented
// answer, and the guard's destructor drops that as this does.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/system_executor.hpp>

#include "pgmutex/asio/access.hpp"
#include "pgmutex/asio/acquire_op.hpp"
#include "pgmutex/asio/completion.hpp"
#include "pgmutex/asio/error.hpp"
#include "pgmutex/asio/statements.hpp"
#include "pgmutex/asio/wait_lost_op.hpp"

namespace pgmutex::asio_detail {

using Access = detail::AsyncAccess;

template <class Guard>
using GuardSignature = void(boost::system::error_code, Guard);
using DoneSignature = void(boost::system::error_code);

// Where a guard's handlers run by default: its mutex's loop; an empty
// guard has none, and its operation completes at once, with an error.
template <class Guard>
boost::asio::any_io_executor loop_of_guard(const Guard& guard) {
  if (auto* state = Access::guard_state(guard)) return loop_of(*state);
  return boost::asio::system_executor();
}

// One statement, which cannot be interrupted: no cancellation slot.
template <class Mutex, class Token>
auto async_create_schema(Mutex& mutex, Token&& token) {
  return boost::asio::async_initiate<Token, DoneSignature>(
      [](auto handler, Mutex shared) {
        auto* state = Access::state_of(shared);
        Completion<decltype(handler)> done(std::move(handler), loop_of(*state));
        run_statements_of(state, [done = std::move(done), shared = std::move(shared)]() mutable {
          auto made = shared.create_schema(nothrow);
          { Mutex gone = std::move(shared); }  // our share goes before the handler may run (see AcquireOp::finish)
          done.complete(error_of(made));
        });
      },
      token, Access::share(mutex));
}

template <class Mutex, class Token>
auto async_try_acquire(Mutex& mutex, Token&& token) {
  using Guard = typename Mutex::guard_type;
  return boost::asio::async_initiate<Token, GuardSignature<Guard>>(
      [](auto handler, Mutex shared) {
        auto* state = Access::state_of(shared);
        Completion<decltype(handler)> done(std::move(handler), loop_of(*state));
        run_statements_of(state, [done = std::move(done), shared = std::move(shared)]() mutable {
          auto got = shared.try_acquire(nothrow);
          { Mutex gone = std::move(shared); }  // our share goes before the handler may run (see AcquireOp::finish)
          if (got) done.complete(boost::system::error_code(), std::move(*got));
          else done.complete(to_error_code(got.error()), Guard());
        });
      },
      token, Access::share(mutex));
}

// `announce`: an async campaign's (AcquireOp's constructor), or null.
template <class Mutex, class Token>
auto async_acquire(Mutex& mutex, std::optional<std::chrono::nanoseconds> timeout, Token&& token,
                   GrantAnnouncement* announce = nullptr) {
  using Guard = typename Mutex::guard_type;
  return boost::asio::async_initiate<Token, GuardSignature<Guard>>(
      [](auto handler, Mutex shared, std::optional<std::chrono::nanoseconds> limit, GrantAnnouncement* announce) {
        const auto loop = loop_of(*Access::state_of(shared));
        auto op = std::make_shared<AcquireOp<Mutex, decltype(handler)>>(std::move(shared), std::move(handler), loop,
                                                                         limit, announce);
        op->start();
      },
      token, Access::share(mutex), timeout, announce);
}

// The grant leaves the user's guard now (moved into the operation), as
// release() takes it at once. A lost lease completes with success; an empty
// guard with lock_not_held (it never owned a grant).
template <class Guard, class Token>
auto async_release(Guard&& guard, Token&& token) {
  const auto loop = loop_of_guard(guard);
  return boost::asio::async_initiate<Token, DoneSignature>(
      [](auto handler, Guard owned, boost::asio::any_io_executor on) {
        Completion<decltype(handler)> done(std::move(handler), on);
        auto* state = Access::guard_state(owned);
        run_statements_of(state, [done = std::move(done), owned = std::move(owned)]() mutable {
          const bool owned_a_grant = owned.owns_lock();
          auto released = owned.release(nothrow);
          // A grant that owned its row until the lease was lost: no error (see above).
          if (!released && owned_a_grant && released.error() == Errc::lock_not_held) released = {};
          done.complete(error_of(released));
        });
      },
      token, std::move(guard), loop);
}

// On the I/O pool, never on a backend's thread: a heartbeat that finds the
// lease lost runs the grant's stop callbacks (user code, which may block) on
// the thread that sent it.
template <class Guard, class Token>
auto async_heartbeat(Guard& guard, Token&& token) {
  using State = std::remove_pointer_t<decltype(Access::guard_state(guard))>;
  const auto loop = loop_of_guard(guard);
  return boost::asio::async_initiate<Token, DoneSignature>(
      [](auto handler, Share<State> state, std::uint64_t generation, boost::asio::any_io_executor on) {
        Completion<decltype(handler)> done(std::move(handler), on);
        run_off_loop([done = std::move(done), state = std::move(state), generation]() mutable {
          if (state.get() == nullptr) return done.complete(to_error_code(Error(Errc::lock_not_held, "guard does not own a lock")));
          auto beat = state.get()->heartbeat_grant(generation);
          { Share<State> gone = std::move(state); }  // before the handler may run (see AcquireOp::finish)
          done.complete(error_of(beat));
        });
      },
      token, Share<State>(Access::guard_state(guard)), Access::generation(guard), loop);
}

// An empty guard has no lease to lose: lock_not_held at once.
template <class Guard, class Token>
auto async_wait_lost(Guard& guard, Token&& token) {
  auto* state = Access::guard_state(guard);
  std::optional<std::stop_token> lost;
  if (state != nullptr) lost = state->grant_stop_token(Access::generation(guard));
  return boost::asio::async_initiate<Token, DoneSignature>(
      [](auto handler, std::optional<std::stop_token> lost, boost::asio::any_io_executor on) {
        if (!lost) {
          Completion<decltype(handler)>(std::move(handler), on)
              .complete(to_error_code(Error(Errc::lock_not_held, "guard does not own a lock")));
          return;
        }
        auto op = std::make_shared<WaitLostOp<decltype(handler)>>(std::move(handler), on);
        op->start(std::move(*lost));
      },
      token, std::move(lost), loop_of_guard(guard));
}

}  // namespace pgmutex::asio_detail
