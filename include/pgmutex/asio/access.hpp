// detail::AsyncAccess: the one door the async forms use into a mutex's and a
// guard's shared state (declared a friend in basic_mutex.hpp and guard.hpp),
// so that the core keeps its members private and free of Asio.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "pgmutex/basic_mutex.hpp"

namespace pgmutex::detail {

struct AsyncAccess {
  // A second mutex object on the same state: an operation holds one, so it
  // survives the user moving or destroying theirs while it runs.
  template <class Mutex>
  static Mutex share(Mutex& mutex) noexcept {
    mutex.state_->add_owner();
    return Mutex(mutex.state_);
  }

  template <class Mutex>
  static auto* state_of(Mutex& mutex) noexcept {
    return mutex.state_;
  }

  template <class Guard>
  static auto* guard_state(const Guard& guard) noexcept {
    return guard.state_;
  }
  template <class Guard>
  static std::uint64_t generation(const Guard& guard) noexcept {
    return guard.generation_;
  }

  // An empty guard that says why (timeout, cancelled) and who held the lock,
  // as the blocking acquire returns one.
  template <class Guard>
  static Guard empty_guard(Errc why, std::optional<HolderInfo> holder) {
    return Guard(why, std::move(holder));
  }
};

}  // namespace pgmutex::detail
