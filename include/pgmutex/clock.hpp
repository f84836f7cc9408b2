// The client's monotonic time: heartbeat cadence, waits, timeouts, latency and
// the holder's watchdog. Never staleness: that is judged on the server's clock.
#pragma once

#include <chrono>
#include <concepts>

namespace pgmutex {

template <class C>
concept ClockHasNow = requires(const C& clock) {
  typename C::time_point;
  typename C::duration;
  { clock.now() } -> std::same_as<typename C::time_point>;
};

template <class C>
concept Clock = std::copyable<C> && ClockHasNow<C>;

struct SteadyClock {
  using duration = std::chrono::steady_clock::duration;
  using time_point = std::chrono::steady_clock::time_point;
  [[nodiscard]] time_point now() const noexcept { return std::chrono::steady_clock::now(); }
};

}  // namespace pgmutex
