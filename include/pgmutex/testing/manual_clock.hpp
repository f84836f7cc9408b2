// Virtual time for tests: it moves only when a test (or a ManualExecutor) moves it.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

namespace pgmutex::testing {

// A handle: copies share one time line, so a mutex, its executor and the test
// all read the same now().
class ManualClock {
 public:
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<ManualClock, duration>;
  static constexpr bool is_steady = true;

  ManualClock() : now_(std::make_shared<std::atomic<rep>>(0)) {}

  [[nodiscard]] time_point now() const noexcept { return time_point(duration(now_->load(std::memory_order_acquire))); }

  // Moves time forward only; a ManualExecutor runs the tasks that fall due.
  void advance(duration d) noexcept { now_->fetch_add(d.count(), std::memory_order_acq_rel); }
  void set(time_point t) noexcept {
    rep expected = now_->load(std::memory_order_acquire);
    while (t.time_since_epoch().count() > expected &&
           !now_->compare_exchange_weak(expected, t.time_since_epoch().count(), std::memory_order_acq_rel)) {
    }
  }

  friend bool operator==(const ManualClock& a, const ManualClock& b) noexcept { return a.now_ == b.now_; }

 private:
  std::shared_ptr<std::atomic<rep>> now_;
};

}  // namespace pgmutex::testing
