// Metrics hooks. A metrics type implements any subset of the hooks below, as
// member functions with these exact parameter lists:
//
//   acquired         (std::string_view lock_name, std::string_view instance_id, Fence fence)
//   released         (std::string_view lock_name, std::string_view instance_id)
//   contended        (std::string_view lock_name, std::string_view instance_id)
//   stale_reclaimed  (std::string_view lock_name, std::string_view instance_id, std::string_view previous_holder)
//   alert            (std::string_view lock_name, std::string_view holder, double seconds_since_heartbeat)
//   heartbeat_latency(std::string_view lock_name, std::string_view instance_id, double seconds)
//   acquire_latency  (std::string_view lock_name, std::string_view instance_id, double seconds)
//   lost             (std::string_view lock_name, std::string_view instance_id, const Error& reason)
//   heartbeat_failed (std::string_view lock_name, std::string_view instance_id, const Error& error)
//   lease_renewed    (std::string_view lock_name, std::string_view instance_id, std::chrono::nanoseconds deadline)
//
// lease_renewed tells each new lease deadline (at the grant, and each time a
// heartbeat moves it), as the mutex Clock's time_since_epoch: for
// SteadyClock, CLOCK_MONOTONIC on Linux, which every process of the machine
// shares (pgmutex run hands it to its guard process). Never later than the
// deadline the mutex itself enforces.
//
// stale_reclaimed fires when the server's answer says the grant took over a
// stale row. An acquire whose reply was lost, and whose row was then read
// back as its own, reports acquired alone: whom it replaced is not known.
//
// Presence is detected at compile time: an absent hook generates no code. A
// member with a hook's name but another signature fails the Metrics concept
// with the hook's name in the error. A hook that throws never breaks the lock.
#pragma once

#include <chrono>
#include <string_view>
#include <tuple>
#include <utility>

#include "pgmutex/backend.hpp"
#include "pgmutex/error.hpp"

namespace pgmutex {

namespace metrics_detail {
template <class M, class... Args>
constexpr void call_guarded(M& sink, auto hook, Args&&... args) noexcept {
  try {
    hook(sink, std::forward<Args>(args)...);
  } catch (...) {
    // A broken metrics sink must never break the lock.
  }
}
}  // namespace metrics_detail

// For each hook: `<Hook>Named` (the type has a member of that name),
// `<Hook>Callable` (it takes the documented arguments), the sub-concept
// MetricsHook_<hook> that the Metrics concept is made of, and call_<hook>(),
// which calls the hook if present and swallows what it throws.
#define PGMUTEX_METRICS_HOOK(hook, params, args)                                                 \
  template <class M>                                                                             \
  concept M##hook##_named = requires { &M::hook; };                                              \
  template <class M>                                                                             \
  concept MetricsHook_##hook = !requires { &M::hook; } || requires(M & m, params) { m.hook args; }; \
  template <class M>                                                                             \
  constexpr void call_##hook(M& m, params) noexcept {                                            \
    if constexpr (requires { m.hook args; })                                                     \
      metrics_detail::call_guarded(m, [&](M& sink) { sink.hook args; });                         \
  }

#define PGMUTEX_PARAMS(...) __VA_ARGS__
PGMUTEX_METRICS_HOOK(acquired, PGMUTEX_PARAMS(std::string_view lock_name, std::string_view instance_id, Fence fence),
                     (lock_name, instance_id, fence))
PGMUTEX_METRICS_HOOK(released, PGMUTEX_PARAMS(std::string_view lock_name, std::string_view instance_id),
                     (lock_name, instance_id))
PGMUTEX_METRICS_HOOK(contended, PGMUTEX_PARAMS(std::string_view lock_name, std::string_view instance_id),
                     (lock_name, instance_id))
PGMUTEX_METRICS_HOOK(stale_reclaimed,
                     PGMUTEX_PARAMS(std::string_view lock_name, std::string_view instance_id,
                                    std::string_view previous_holder),
                     (lock_name, instance_id, previous_holder))
PGMUTEX_METRICS_HOOK(alert, PGMUTEX_PARAMS(std::string_view lock_name, std::string_view holder, double seconds),
                     (lock_name, holder, seconds))
PGMUTEX_METRICS_HOOK(heartbeat_latency,
                     PGMUTEX_PARAMS(std::string_view lock_name, std::string_view instance_id, double seconds),
                     (lock_name, instance_id, seconds))
// The round trip of the acquire statement that won a grant.
PGMUTEX_METRICS_HOOK(acquire_latency,
                     PGMUTEX_PARAMS(std::string_view lock_name, std::string_view instance_id, double seconds),
                     (lock_name, instance_id, seconds))
PGMUTEX_METRICS_HOOK(lost, PGMUTEX_PARAMS(std::string_view lock_name, std::string_view instance_id, const Error& reason),
                     (lock_name, instance_id, reason))
PGMUTEX_METRICS_HOOK(heartbeat_failed,
                     PGMUTEX_PARAMS(std::string_view lock_name, std::string_view instance_id, const Error& error),
                     (lock_name, instance_id, error))
PGMUTEX_METRICS_HOOK(lease_renewed,
                     PGMUTEX_PARAMS(std::string_view lock_name, std::string_view instance_id,
                                    std::chrono::nanoseconds deadline),
                     (lock_name, instance_id, deadline))
#undef PGMUTEX_PARAMS
#undef PGMUTEX_METRICS_HOOK

template <class M>
concept Metrics = std::copy_constructible<M> && MetricsHook_acquired<M> && MetricsHook_released<M> &&
                  MetricsHook_contended<M> && MetricsHook_stale_reclaimed<M> && MetricsHook_alert<M> &&
                  MetricsHook_heartbeat_latency<M> && MetricsHook_acquire_latency<M> && MetricsHook_lost<M> && MetricsHook_heartbeat_failed<M> &&
                  MetricsHook_lease_renewed<M>;

// No hooks at all: every call compiles to nothing.
struct NoMetrics {};

// Several sinks as one: each hook goes to every sink that has it, each call
// guarded on its own so one throwing sink does not starve the others.
template <Metrics... Sinks>
class MetricsFanout {
 public:
  MetricsFanout() = default;
  explicit MetricsFanout(Sinks... sinks) : sinks_(std::move(sinks)...) {}

  template <std::size_t I>
  auto& sink() noexcept { return std::get<I>(sinks_); }

  void acquired(std::string_view l, std::string_view i, Fence f) { each([&](auto& s) { call_acquired(s, l, i, f); }); }
  void released(std::string_view l, std::string_view i) { each([&](auto& s) { call_released(s, l, i); }); }
  void contended(std::string_view l, std::string_view i) { each([&](auto& s) { call_contended(s, l, i); }); }
  void stale_reclaimed(std::string_view l, std::string_view i, std::string_view p) {
    each([&](auto& s) { call_stale_reclaimed(s, l, i, p); });
  }
  void alert(std::string_view l, std::string_view h, double s) { each([&](auto& x) { call_alert(x, l, h, s); }); }
  void heartbeat_latency(std::string_view l, std::string_view i, double s) {
    each([&](auto& x) { call_heartbeat_latency(x, l, i, s); });
  }
  void acquire_latency(std::string_view l, std::string_view i, double s) {
    each([&](auto& x) { call_acquire_latency(x, l, i, s); });
  }
  void lost(std::string_view l, std::string_view i, const Error& e) { each([&](auto& s) { call_lost(s, l, i, e); }); }
  void heartbeat_failed(std::string_view l, std::string_view i, const Error& e) {
    each([&](auto& s) { call_heartbeat_failed(s, l, i, e); });
  }
  void lease_renewed(std::string_view l, std::string_view i, std::chrono::nanoseconds d) {
    each([&](auto& s) { call_lease_renewed(s, l, i, d); });
  }

 private:
  template <class F>
  void each(F&& f) {
    std::apply([&](auto&... sink) { (f(sink), ...); }, sinks_);
  }
  std::tuple<Sinks...> sinks_;
};

template <class... Sinks>
MetricsFanout(Sinks...) -> MetricsFanout<Sinks...>;

}  // namespace pgmutex
