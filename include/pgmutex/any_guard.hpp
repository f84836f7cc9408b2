// AnyGuard: the guard of any BasicMutex, its type erased — what
// AnyMutex::try_acquire() and acquire() return. It has the members of
// BasicGuard and behaves the same: true while it holds the lock, released on
// scope exit, lost() and a stop_token that is stopped when the lease is lost.
//
// Two choices keep it as cheap as the guard it erases:
//  - the concrete guard lives inside the AnyGuard, in a buffer of its exact
//    size: every BasicGuard<State> has one layout (the state is only pointed
//    to), so no acquire allocates;
//  - its operations go through a table of plain functions in static storage,
//    one per guard type, not through the AnyMutex that made it: a guard may
//    outlive its mutex, and then still releases its grant.
#pragma once

#include <cstddef>
#include <new>
#include <optional>
#include <stop_token>
#include <type_traits>
#include <utility>

#include "pgmutex/error.hpp"
#include "pgmutex/guard.hpp"

namespace pgmutex {

namespace detail {

// Stands for any mutex state: sizeof(BasicGuard<S>) is the same for all S.
struct AnyGuardState;
using GuardOfAnyState = BasicGuard<AnyGuardState>;

// The operations of one guard type, on a guard stored at `self`.
struct AnyGuardVtable {
  void (*move_to)(void* self, void* destination) noexcept;  // move-constructs at destination
  void (*destroy)(void* self) noexcept;
  bool (*holds)(const void* self) noexcept;
  bool (*owns_lock)(const void* self) noexcept;
  Fence (*fence)(const void* self) noexcept;
  bool (*lost)(const void* self) noexcept;
  std::stop_token (*stop_token)(const void* self);
  Errc (*why)(const void* self) noexcept;
  const std::optional<HolderInfo>& (*holder)(const void* self) noexcept;
  Result<void> (*heartbeat)(void* self);
  Result<void> (*release)(void* self);
};

template <class G>
const G& guard_at(const void* self) noexcept {
  return *std::launder(static_cast<const G*>(self));
}
template <class G>
G& guard_at(void* self) noexcept {
  return *std::launder(static_cast<G*>(self));
}

template <class G>
inline constexpr AnyGuardVtable any_guard_vtable{
    [](void* self, void* destination) noexcept { ::new (destination) G(std::move(guard_at<G>(self))); },
    [](void* self) noexcept { guard_at<G>(self).~G(); },
    [](const void* self) noexcept { return static_cast<bool>(guard_at<G>(self)); },
    [](const void* self) noexcept { return guard_at<G>(self).owns_lock(); },
    [](const void* self) noexcept { return guard_at<G>(self).fence(); },
    [](const void* self) noexcept { return guard_at<G>(self).lost(); },
    [](const void* self) { return guard_at<G>(self).stop_token(); },
    [](const void* self) noexcept { return guard_at<G>(self).why(); },
    [](const void* self) noexcept -> const std::optional<HolderInfo>& { return guard_at<G>(self).holder(); },
    [](void* self) { return guard_at<G>(self).heartbeat(nothrow); },
    [](void* self) { return guard_at<G>(self).release(nothrow); },
};

}  // namespace detail

class AnyGuard {
 public:
  // Empty, like a default BasicGuard: false, why() == Errc::lock_held.
  AnyGuard() noexcept = default;

  // Takes over `guard` (and its grant, if it holds one).
  template <class State>
  explicit AnyGuard(BasicGuard<State>&& guard) noexcept : vtable_(&detail::any_guard_vtable<BasicGuard<State>>) {
    static_assert(sizeof(BasicGuard<State>) == sizeof(storage_) &&
                      alignof(BasicGuard<State>) == alignof(detail::GuardOfAnyState),
                  "every BasicGuard has one layout: AnyGuard stores it in place");
    ::new (static_cast<void*>(storage_)) BasicGuard<State>(std::move(guard));
  }

  AnyGuard(AnyGuard&& other) noexcept { take(other); }
  AnyGuard& operator=(AnyGuard&& other) noexcept {
    if (this != &other) {
      reset();  // releases a grant this guard holds, as BasicGuard's assignment does
      take(other);
    }
    return *this;
  }
  AnyGuard(const AnyGuard&) = delete;
  AnyGuard& operator=(const AnyGuard&) = delete;
  ~AnyGuard() { reset(); }

  // The members of BasicGuard (guard.hpp), with the same meaning.
  explicit operator bool() const noexcept { return vtable_ != nullptr && vtable_->holds(storage_); }
  [[nodiscard]] bool owns_lock() const noexcept { return vtable_ != nullptr && vtable_->owns_lock(storage_); }
  [[nodiscard]] Fence fence() const noexcept { return vtable_ != nullptr ? vtable_->fence(storage_) : 0; }
  [[nodiscard]] bool lost() const noexcept { return vtable_ != nullptr && vtable_->lost(storage_); }
  [[nodiscard]] std::stop_token stop_token() const {
    return vtable_ != nullptr ? vtable_->stop_token(storage_) : std::stop_token{};
  }
  [[nodiscard]] Errc why() const noexcept { return vtable_ != nullptr ? vtable_->why(storage_) : Errc::lock_held; }
  [[nodiscard]] const std::optional<HolderInfo>& holder() const noexcept {
    return vtable_ != nullptr ? vtable_->holder(storage_) : no_holder;
  }

  Result<void> heartbeat(nothrow_t) {
    if (vtable_ == nullptr) return fail(Errc::lock_not_held, "guard does not own a lock");
    return vtable_->heartbeat(storage_);
  }
  void heartbeat() { value_or_throw(heartbeat(nothrow)); }

  Result<void> release(nothrow_t) {
    if (vtable_ == nullptr) return fail(Errc::lock_not_held, "guard does not own a lock");
    return vtable_->release(storage_);
  }
  void release() { value_or_throw(release(nothrow)); }

 private:
  void take(AnyGuard& other) noexcept {
    vtable_ = other.vtable_;
    if (vtable_ != nullptr) vtable_->move_to(other.storage_, storage_);  // `other` keeps an empty guard
  }
  void reset() noexcept {
    if (vtable_ != nullptr) std::exchange(vtable_, nullptr)->destroy(storage_);
  }

  static inline const std::optional<HolderInfo> no_holder{};

  const detail::AnyGuardVtable* vtable_ = nullptr;
  alignas(detail::GuardOfAnyState) std::byte storage_[sizeof(detail::GuardOfAnyState)];
};

}  // namespace pgmutex
