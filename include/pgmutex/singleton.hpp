// singleton: wrap a function so that it runs only while this instance holds
// the lock — the C++ form of the seed's `@mutex.singleton` decorator.
#pragma once

#include <chrono>
#include <concepts>
#include <functional>
#include <optional>
#include <stop_token>
#include <type_traits>
#include <utility>

#include "pgmutex/error.hpp"

namespace pgmutex {

// How to acquire: one try (the default), or wait, optionally up to a timeout.
struct WaitPolicy {
  bool blocking = false;
  std::optional<std::chrono::nanoseconds> timeout = std::nullopt;
};

namespace singleton_detail {

// The function may take the guard, the guard's stop_token, or neither, first.
template <class F, class Guard, class... Args>
decltype(auto) invoke_held(F& fn, Guard& guard, Args&&... args) {
  if constexpr (std::is_invocable_v<F&, Guard&, Args...>)
    return std::invoke(fn, guard, std::forward<Args>(args)...);
  else if constexpr (std::is_invocable_v<F&, std::stop_token, Args...>)
    return std::invoke(fn, guard.stop_token(), std::forward<Args>(args)...);
  else
    return std::invoke(fn, std::forward<Args>(args)...);
}

template <class F, class Guard, class... Args>
using held_result_t = decltype(invoke_held(std::declval<F&>(), std::declval<Guard&>(), std::declval<Args>()...));

// void functions report whether they ran; others return their result if they ran.
template <class R>
using ran_t = std::conditional_t<std::is_void_v<R>, bool, std::optional<R>>;

}  // namespace singleton_detail

template <class Mutex, class F>
class Singleton {
 public:
  // `mutex` shares the state of the mutex singleton() was called on.
  Singleton(Mutex mutex, F fn, WaitPolicy wait) : mutex_(std::move(mutex)), fn_(std::move(fn)), wait_(wait) {}

  // Runs fn if the lock is acquired. void fn: true if it ran; else its result
  // if it ran, std::nullopt if another instance held the lock.
  template <class... Args>
  auto operator()(Args&&... args) {
    return value_or_throw(call(nothrow, std::forward<Args>(args)...));
  }

  template <class... Args>
  auto call(nothrow_t, Args&&... args)
      -> Result<singleton_detail::ran_t<singleton_detail::held_result_t<F, typename Mutex::guard_type, Args...>>> {
    using R = singleton_detail::held_result_t<F, typename Mutex::guard_type, Args...>;
    using Ran = singleton_detail::ran_t<R>;
    auto guard = wait_.blocking ? mutex_.acquire(nothrow, wait_.timeout) : mutex_.try_acquire(nothrow);
    if (!guard) return tl::unexpected(std::move(guard.error()));
    if (!*guard) return Ran{};
    // The guard releases on the way out, also when fn throws.
    if constexpr (std::is_void_v<R>) {
      singleton_detail::invoke_held(fn_, *guard, std::forward<Args>(args)...);
      return true;
    } else {
      return Ran(singleton_detail::invoke_held(fn_, *guard, std::forward<Args>(args)...));
    }
  }

 private:
  Mutex mutex_;
  F fn_;
  WaitPolicy wait_;
};

}  // namespace pgmutex
