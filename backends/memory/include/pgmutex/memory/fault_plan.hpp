// detail::FaultPlan: the faults a test arms on a MemoryServer (planned
// failures and lost replies, dropped, partitioned and killed connections, the next n
// operations failing) and the decision, per operation, of which one it
// meets. Pure state: the server calls it with its own lock held. Latency and
// hung statements are not here: they are waited out before that lock is taken.
#pragma once

#include <algorithm>
#include <deque>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "pgmutex/error.hpp"

namespace pgmutex::detail {

class FaultPlan {
 public:
  // A fault plan: the next operations meet these faults in order, one each
  // (any connection), before the standing faults below apply.
  enum class Fault {
    none,        // the operation runs normally
    fail,        // it fails with backend_unavailable and changes nothing
    lose_reply,  // it is applied, but the reply is lost (outcome_unknown)
  };

  void plan(std::initializer_list<Fault> faults) {
    plan_.insert(plan_.end(), faults);
    rearm();
  }
  void fail_next(int n, Errc error) {
    fail_next_ = n;
    fail_with_ = error;
    rearm();
  }
  // A restart or a failover: the next operation fails as its connection did.
  void connections_broken() {
    fail_next_ = std::max(fail_next_, 1);
    fail_with_ = Errc::backend_unavailable;
    rearm();
  }
  void drop_connection(std::string_view connection) {
    dropped_.emplace(connection);
    rearm();
  }
  void partition(std::string_view connection) {
    partitioned_.emplace(connection);
    rearm();
  }
  void heal(std::string_view connection) {
    if (const auto it = partitioned_.find(connection); it != partitioned_.end()) partitioned_.erase(it);
    rearm();
  }
  void lose_replies(int n) {
    lose_replies_ = n;
    rearm();
  }
  // A process death: the connection closed, and stays closed.
  void kill(std::string_view connection) {
    killed_.emplace(connection);
    rearm();
  }
  // Whether planned failures or lost replies wait for the next operations.
  [[nodiscard]] bool pending() const noexcept { return !plan_.empty() || fail_next_ > 0 || lose_replies_ > 0; }
  [[nodiscard]] bool killed(std::string_view connection) const {
    return !killed_.empty() && killed_.contains(connection);
  }

  // Before an operation runs: the error to report instead of running it, or nothing.
  std::optional<Error> admit(std::string_view connection) {
    if (!armed_) [[likely]]
      return std::nullopt;
    auto error = admit_armed(connection);
    rearm();
    return error;
  }
  // After an operation was applied: whether its reply is lost.
  bool reply_lost() {
    if (!armed_ || lose_replies_ <= 0) [[likely]]
      return false;
    --lose_replies_;
    rearm();
    return true;
  }

 private:
  // After every change: whether any fault is armed, so that an operation
  // without faults checks one flag.
  void rearm() noexcept {
    armed_ = !plan_.empty() || !partitioned_.empty() || !killed_.empty() || !dropped_.empty() || fail_next_ > 0 || lose_replies_ > 0;
  }

  std::optional<Error> admit_armed(std::string_view connection) {
    if (!plan_.empty()) {
      const Fault fault = plan_.front();
      plan_.pop_front();
      if (fault == Fault::fail) return Error(Errc::backend_unavailable, "planned failure");
      if (fault == Fault::lose_reply) ++lose_replies_;
    }
    if (!killed_.empty() && killed_.contains(connection))
      return Error(Errc::backend_unavailable, "connection '" + std::string(connection) + "' is closed (its process died)");
    if (!partitioned_.empty() && partitioned_.contains(connection))
      return Error(Errc::backend_unavailable, "connection '" + std::string(connection) + "' is partitioned");
    if (!dropped_.empty()) {
      if (const auto it = dropped_.find(connection); it != dropped_.end()) {
        dropped_.erase(it);
        return Error(Errc::backend_unavailable, "connection dropped");
      }
    }
    if (fail_next_ > 0) {
      --fail_next_;
      return Error(fail_with_, "injected failure");
    }
    return std::nullopt;
  }

  bool armed_ = false;
  int fail_next_ = 0;
  Errc fail_with_ = Errc::backend_unavailable;
  int lose_replies_ = 0;
  std::deque<Fault> plan_;
  std::set<std::string, std::less<>> dropped_;
  std::set<std::string, std::less<>> partitioned_;
  std::set<std::string, std::less<>> killed_;
};

}  // namespace pgmutex::detail
