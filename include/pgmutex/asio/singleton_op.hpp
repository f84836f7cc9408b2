// AsyncSingleton: the async form of Singleton (the seed's singleton_async),
// made by mutex.async_singleton(fn, wait) or, under a lock name given per
// call, mutex.async_singleton(lock_name, fn, wait). Each call
//
//   co_spawn(loop) -> acquire (async_try_acquire, or async_acquire per the
//   WaitPolicy) -> held: co_await fn(...) -> async_release -> complete
//
// `fn` is a coroutine (it returns boost::asio::awaitable<R>) that may take
// the guard, its stop_token, or nothing. A call completes as co_spawn does,
// with void(std::exception_ptr, Ran): Ran is bool (whether fn ran) when R is
// void, else std::optional<R> (empty: another instance held the lock). A
// backend error, a cancellation (operation_aborted) and what fn throws come
// as the exception_ptr (use_awaitable and use_future throw it). The lock is
// released with async_release also when fn throws or the call is cancelled
// while fn runs, never with a blocking statement on the loop.
#pragma once

#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include "pgmutex/asio/access.hpp"
#include "pgmutex/asio/completion.hpp"
#include "pgmutex/singleton.hpp"

namespace pgmutex::asio_detail {

template <class T>
struct awaited;
template <class T, class Executor>
struct awaited<boost::asio::awaitable<T, Executor>> {
  using type = T;
};

template <class Mutex, class F>
class AsyncSingleton {
  using Guard = typename Mutex::guard_type;
  using Awaitable = std::remove_cvref_t<singleton_detail::held_result_t<F, Guard>>;
  static_assert(requires { typename awaited<Awaitable>::type; },
                "async_singleton's function is a coroutine: it returns boost::asio::awaitable<T>");

 public:
  using result_type = typename awaited<Awaitable>::type;
  using ran_type = singleton_detail::ran_t<result_type>;

  // `mutex` is the wrapper's own: on the state of the mutex async_singleton
  // was called on, or a new one under the lock name given.
  AsyncSingleton(Mutex mutex, F fn, WaitPolicy wait)
      : mutex_(std::make_shared<Mutex>(std::move(mutex))), fn_(std::make_shared<F>(std::move(fn))), wait_(wait) {}

  // One run: completes with void(std::exception_ptr, ran_type). The
  // token's cancellation slot reaches the acquire and fn's own waits.
  template <class Token>
  auto operator()(Token&& token) {
    const auto loop = loop_of(*detail::AsyncAccess::state_of(*mutex_));
    return boost::asio::co_spawn(loop, run(mutex_, fn_, wait_), std::forward<Token>(token));
  }

 private:
  // The mutex and fn are shared with every run in flight, so the wrapper may go first.
  static boost::asio::awaitable<ran_type> run(std::shared_ptr<Mutex> mutex, std::shared_ptr<F> fn, WaitPolicy wait) {
    using boost::asio::use_awaitable;
    // A cancellation while fn runs must not skip the release below.
    co_await boost::asio::this_coro::throw_if_cancelled(false);
    Guard guard;  // (no co_await inside a conditional expression: GCC has miscompiled those)
    if (wait.blocking) guard = co_await mutex->async_acquire(wait.timeout, use_awaitable);
    else guard = co_await mutex->async_try_acquire(use_awaitable);
    if (!guard) co_return ran_type{};
    std::exception_ptr failed;
    std::optional<ran_type> ran;
    try {
      if constexpr (std::is_void_v<result_type>) {
        co_await singleton_detail::invoke_held(*fn, guard);
        ran.emplace(true);
      } else {
        ran.emplace(co_await singleton_detail::invoke_held(*fn, guard));
      }
    } catch (...) {
      failed = std::current_exception();
    }
    // A lost lease is no error here; what fn threw comes before a release's error.
    auto [released] = co_await guard.async_release(boost::asio::as_tuple(use_awaitable));
    if (failed) std::rethrow_exception(failed);
    if (released) throw boost::system::system_error(released);
    co_return std::move(*ran);
  }

  std::shared_ptr<Mutex> mutex_;
  std::shared_ptr<F> fn_;
  WaitPolicy wait_;
};

}  // namespace pgmutex::asio_detail
