// Virtual time for tests: it moves only when a test (or a ManualExecutor) moves it.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

#include "pgmutex/detail/light_mutex.hpp"  // PGMUTEX_ALWAYS_INLINE

namespace pgmutex::testing {

// A handle: copies share one time line, so a mutex, its executor and the test
// all read the same now(). drifting(rate) gives a handle on the same time line
// that runs `rate` times as fast from now on: a client whose clock drifts.
class ManualClock {
 public:
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<ManualClock, duration>;
  static constexpr bool is_steady = true;

  ManualClock() : now_(std::make_shared<std::atomic<rep>>(0)) {}

  // Read several times per acquire/release cycle: inlined for sure.
  [[nodiscard]] PGMUTEX_ALWAYS_INLINE time_point now() const noexcept {
    const rep shared = now_->load(std::memory_order_acquire);
    if (!drifting_) [[likely]]  // a flag, not rate_ == 1.0: a double compare is twice the instructions
      return time_point(duration(shared));
    return time_point(duration(origin_ + static_cast<rep>(static_cast<double>(shared - origin_) * rate_)));
  }

  // The same time line, read `rate` times as fast from now on (1.05: 5% fast).
  // Advancing either handle moves the shared time line, in true time.
  [[nodiscard]] ManualClock drifting(double rate) const {
    ManualClock c = *this;
    c.origin_ = now_->load(std::memory_order_acquire);
    c.rate_ = rate;
    c.drifting_ = rate != 1.0;
    return c;
  }

  // Moves time forward only; a ManualExecutor runs the tasks that fall due.
  void advance(duration d) noexcept { now_->fetch_add(d.count(), std::memory_order_acq_rel); }
  // Sets the shared time line (in true time), forward only.
  void set(time_point t) noexcept {
    rep expected = now_->load(std::memory_order_acquire);
    while (t.time_since_epoch().count() > expected &&
           !now_->compare_exchange_weak(expected, t.time_since_epoch().count(), std::memory_order_acq_rel)) {
    }
  }

  friend bool operator==(const ManualClock& a, const ManualClock& b) noexcept { return a.now_ == b.now_; }

 private:
  std::shared_ptr<std::atomic<rep>> now_;
  rep origin_ = 0;     // where a drifting handle starts to drift
  double rate_ = 1.0;  // how fast this handle reads the time line
  bool drifting_ = false;  // rate_ != 1.0
};

}  // namespace pgmutex::testing
