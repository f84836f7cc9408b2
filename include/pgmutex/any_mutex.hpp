// AnyMutex: any BasicMutex behind one type, in the spirit of Asio's
// any_io_executor and Boost.MySQL's any_connection. Code that takes an
// AnyMutex& is compiled once and runs on pgmutex::Mutex (Postgres) in
// production and on testing::SimMutex (virtual time, in-memory server) in its
// tests, without becoming a template over the mutex type.
//
//   pgmutex::AnyMutex mutex = pgmutex::Mutex(backend, options);   // production
//   pgmutex::AnyMutex mutex = sim.instance(options);              // tests
//
// The cost: one heap allocation per AnyMutex (the wrapped mutex, behind one
// virtual interface) and one indirect call per operation. Acquiring does not
// allocate: the guard (AnyGuard) holds the concrete guard in place.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <stop_token>
#include <string_view>
#include <utility>

#include "pgmutex/any_guard.hpp"
#include "pgmutex/backend.hpp"
#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/detail/lockable.hpp"
#include "pgmutex/error.hpp"
#include "pgmutex/singleton.hpp"

namespace pgmutex {

namespace detail {

// What AnyMutex needs of the mutex it wraps: BasicMutex's operations, in
// their expected-returning forms (the throwing ones are built on these once,
// in AnyMutex, instead of once per mutex type).
class AnyMutexInterface {
 public:
  virtual ~AnyMutexInterface() = default;
  [[nodiscard]] virtual std::string_view lock_name() const noexcept = 0;
  [[nodiscard]] virtual std::string_view instance_id() const noexcept = 0;
  [[nodiscard]] virtual bool held() const noexcept = 0;
  virtual Result<void> create_schema() = 0;
  virtual Result<AnyGuard> try_acquire() = 0;
  virtual Result<AnyGuard> acquire(std::optional<std::chrono::nanoseconds> timeout, std::stop_token stop) = 0;
  virtual Result<void> release() = 0;
  virtual Result<void> heartbeat() = 0;
  virtual Result<std::optional<LockRow>> inspect() = 0;
  // Another object on the same mutex (a singleton wrapper's), and a new
  // mutex under another lock name on a shared backend (see BasicMutex::singleton).
  [[nodiscard]] virtual std::unique_ptr<AnyMutexInterface> share() = 0;
  virtual Result<std::unique_ptr<AnyMutexInterface>> renamed(std::string_view lock_name) = 0;
};

template <class Mutex>
class AnyMutexModel final : public AnyMutexInterface {
 public:
  explicit AnyMutexModel(Mutex&& mutex) noexcept : mutex_(std::move(mutex)) {}

  std::string_view lock_name() const noexcept override { return mutex_.lock_name(); }
  std::string_view instance_id() const noexcept override { return mutex_.instance_id(); }
  bool held() const noexcept override { return mutex_.held(); }
  Result<void> create_schema() override { return mutex_.create_schema(nothrow); }
  Result<AnyGuard> try_acquire() override { return erase(mutex_.try_acquire(nothrow)); }
  Result<AnyGuard> acquire(std::optional<std::chrono::nanoseconds> timeout, std::stop_token stop) override {
    return erase(mutex_.acquire(nothrow, timeout, std::move(stop)));
  }
  Result<void> release() override { return mutex_.release(nothrow); }
  Result<void> heartbeat() override { return mutex_.heartbeat(nothrow); }
  Result<std::optional<LockRow>> inspect() override { return mutex_.inspect(nothrow); }
  std::unique_ptr<AnyMutexInterface> share() override { return std::make_unique<AnyMutexModel>(mutex_.share()); }
  Result<std::unique_ptr<AnyMutexInterface>> renamed(std::string_view lock_name) override {
    auto named = mutex_.renamed(lock_name);
    if (!named) return tl::unexpected(std::move(named.error()));
    return std::unique_ptr<AnyMutexInterface>(std::make_unique<AnyMutexModel>(std::move(*named)));
  }

 private:
  static Result<AnyGuard> erase(Result<typename Mutex::guard_type>&& guard) {
    if (!guard) return tl::unexpected(std::move(guard.error()));
    return AnyGuard(std::move(*guard));
  }

  Mutex mutex_;
};

}  // namespace detail

class AnyMutex {
 public:
  using guard_type = AnyGuard;
  using duration = std::chrono::nanoseconds;

  // Takes over `mutex`, with any grant it holds and the guards it gave out
  // (they keep working). Implicit, like any_io_executor's: an AnyMutex&
  // parameter takes a BasicMutex of any policies.
  template <class B, class C, class M, class E>
  AnyMutex(BasicMutex<B, C, M, E>&& mutex)  // NOLINT(google-explicit-constructor)
      : impl_(std::make_unique<detail::AnyMutexModel<BasicMutex<B, C, M, E>>>(std::move(mutex))) {}
  template <class B, class C, class M, class E>
  AnyMutex(BasicMutex<B, C, M, E>& mutex) = delete;  // AnyMutex takes its mutex over: pass std::move(mutex)

  // A moved-from AnyMutex may only be destroyed or assigned to.
  AnyMutex(AnyMutex&&) noexcept = default;
  AnyMutex& operator=(AnyMutex&&) noexcept = default;
  AnyMutex(const AnyMutex&) = delete;
  AnyMutex& operator=(const AnyMutex&) = delete;
  ~AnyMutex() = default;

  // The operations of BasicMutex (basic_mutex.hpp), with the same meaning.
  [[nodiscard]] std::string_view lock_name() const noexcept { return impl_->lock_name(); }
  [[nodiscard]] std::string_view instance_id() const noexcept { return impl_->instance_id(); }
  [[nodiscard]] bool held() const noexcept { return impl_->held(); }

  Result<void> create_schema(nothrow_t) { return impl_->create_schema(); }
  void create_schema() { value_or_throw(create_schema(nothrow)); }

  Result<AnyGuard> try_acquire(nothrow_t) { return impl_->try_acquire(); }
  AnyGuard try_acquire() { return value_or_throw(try_acquire(nothrow)); }

  Result<AnyGuard> acquire(nothrow_t, std::optional<duration> timeout = std::nullopt, std::stop_token stop = {}) {
    return impl_->acquire(timeout, std::move(stop));
  }
  AnyGuard acquire(std::optional<duration> timeout = std::nullopt, std::stop_token stop = {}) {
    return value_or_throw(acquire(nothrow, timeout, std::move(stop)));
  }

  Result<void> release(nothrow_t) { return impl_->release(); }
  void release() { value_or_throw(release(nothrow)); }

  Result<void> heartbeat(nothrow_t) { return impl_->heartbeat(); }
  void heartbeat() { value_or_throw(heartbeat(nothrow)); }

  Result<std::optional<LockRow>> inspect(nothrow_t) { return impl_->inspect(); }
  std::optional<LockRow> inspect() { return value_or_throw(inspect(nothrow)); }

  // Lockable, as on BasicMutex: the grant lock()/try_lock() take is kept
  // here and shown by lock_guard() (valid until unlock() or a move of this
  // AnyMutex); unlock() throws only when nothing is locked.
  Result<void> lock(nothrow_t) { return detail::lock_into(*this, locked_); }
  void lock() { value_or_throw(lock(nothrow)); }
  Result<bool> try_lock(nothrow_t) { return detail::try_lock_into(*this, locked_); }
  bool try_lock() { return value_or_throw(try_lock(nothrow)); }
  Result<void> unlock(nothrow_t) { return detail::unlock_from(*this, locked_); }
  void unlock() { detail::unlock_or_throw_if_not_locked(*this, locked_); }
  [[nodiscard]] const AnyGuard* lock_guard() const noexcept { return locked_.owns_lock() ? &locked_ : nullptr; }

  // Singletons, as on BasicMutex: `fn` runs only while the lock is held,
  // under this mutex's lock name, or under one given per call on the same
  // backend and options (Errc::invalid_argument, naming the name and the
  // rule, if the options refuse it). The wrapper works on after this
  // AnyMutex is moved or destroyed.
  template <class F>
  Singleton<AnyMutex, F> singleton(F fn, WaitPolicy wait = {}) {
    return Singleton<AnyMutex, F>(AnyMutex(impl_->share()), std::move(fn), wait);
  }
  template <class F>
  Result<Singleton<AnyMutex, F>> singleton(nothrow_t, std::string_view lock_name, F fn, WaitPolicy wait = {}) {
    auto named = impl_->renamed(lock_name);
    if (!named) return tl::unexpected(std::move(named.error()));
    return Singleton<AnyMutex, F>(AnyMutex(std::move(*named)), std::move(fn), wait);
  }
  template <class F>
  Singleton<AnyMutex, F> singleton(std::string_view lock_name, F fn, WaitPolicy wait = {}) {
    return value_or_throw(singleton(nothrow, lock_name, std::move(fn), wait));
  }

 private:
  explicit AnyMutex(std::unique_ptr<detail::AnyMutexInterface> impl) noexcept : impl_(std::move(impl)) {}

  std::unique_ptr<detail::AnyMutexInterface> impl_;
  AnyGuard locked_;  // after impl_: destroyed first, so the grant goes before the mutex
};

}  // namespace pgmutex
