// An observer's position in a lock's election (issue 18): what it has
// reported so far, and what a new reading or notice makes of it. Pure (no
// I/O, no clock), so every rule is tested exhaustively on its own
// (tests/unit/test_observer_cursor.cpp):
// - the first report says who leads now (LeaderEvent::current);
// - a notice at or below the last count is dropped (a duplicate, or one
//   already covered by a reading);
// - a count that jumps is reported with gap and the number missed;
// - a reading whose count went back, or that shows another term or value
//   at the count already reached, is another history (an asynchronous
//   failover lost announcements, and the new primary may have counted as
//   many since, but others): gap, number unknown;
// - a term lower than one already reported is never reported: if it would
//   have been the leader, the observer is told once that nobody leads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "pgmutex/backend.hpp"

namespace pgmutex::detail {

class ObserverCursor {
 public:
  // A reading of the server (leader()): the first, after a reconnect, or at
  // the leader's stale deadline. Returns what changed, if anything.
  std::optional<LeaderChange> look(const LeaderRecord& r) {
    std::optional<Leader> now = leader_of(r);
    if (!started_) {
      started_ = true;
      counted(r.change, r.term, r.value);
      return report(LeaderEvent::current, r.term, r.change, std::move(now), false, 0);
    }
    if (r.change < last_change_ || (r.change == last_change_ && (r.term != last_term_ || r.value != last_value_))) {
      counted(r.change, r.term, r.value);  // another history
      if (r.term < top_term_) return nobody_after_rollback();
      return report(LeaderEvent::current, r.term, r.change, std::move(now), true, std::nullopt);
    }
    if (r.change > last_change_) {
      const std::int64_t missed = r.change - last_change_ - 1;
      counted(r.change, r.term, r.value);
      if (r.term < top_term_) return nobody_after_rollback();
      const LeaderEvent event = now ? (leading_ && r.term == leading_term_ ? LeaderEvent::proclaimed
                                                                           : LeaderEvent::elected)
                                    : (r.announced ? LeaderEvent::expired : LeaderEvent::vacated);
      return report(event, r.term, r.change, std::move(now), missed > 0, missed);
    }
    // The same count: nothing was announced, but the lease may have run out
    // (the leader stopped heartbeating), or come back before anyone took over.
    if (leading_ && !now) return report(LeaderEvent::expired, leading_term_, r.change, std::nullopt, false, 0);
    if (!leading_ && now && r.term >= top_term_) return report(LeaderEvent::current, r.term, r.change, std::move(now), false, 0);
    return std::nullopt;
  }

  // A notice: reported if it is the next count (or later: a gap), dropped if not newer.
  std::optional<LeaderChange> hear(const ElectionNotice& n) {
    if (!started_ || n.change <= last_change_) return std::nullopt;
    const std::int64_t missed = n.change - last_change_ - 1;
    counted(n.change, n.term, n.value);
    if (n.term < top_term_) return nobody_after_rollback();
    if (n.kind == 'v') return report(LeaderEvent::vacated, n.term, n.change, std::nullopt, missed > 0, missed);
    Leader leader{n.term, n.value, n.instance_id, n.host,
                  std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
                      std::chrono::microseconds(n.since_us)))};
    // A proclaim of a term not seen elected (its election missed) begins a term for this observer.
    const LeaderEvent event =
        n.kind == 'p' && leading_ && n.term == leading_term_ ? LeaderEvent::proclaimed : LeaderEvent::elected;
    return report(event, n.term, n.change, std::move(leader), missed > 0, missed);
  }

  [[nodiscard]] bool started() const noexcept { return started_; }
  [[nodiscard]] bool leading() const noexcept { return leading_; }
  [[nodiscard]] std::int64_t last_change() const noexcept { return last_change_; }
  [[nodiscard]] Fence top_term() const noexcept { return top_term_; }

 private:
  // The server's change `change` set `term` and `value`: within one
  // history, whoever reads that count again reads them too.
  void counted(std::int64_t change, Fence term, const std::string& value) {
    last_change_ = change;
    last_term_ = term;
    last_value_ = value;
  }

  LeaderChange report(LeaderEvent event, Fence term, std::int64_t change, std::optional<Leader> leader, bool gap,
                      std::optional<std::int64_t> missed) {
    leading_ = leader.has_value();
    if (leading_) leading_term_ = term;
    top_term_ = std::max(top_term_, term);
    LeaderChange c;
    c.event = event;
    c.term = term;
    c.change = change;
    c.leader = std::move(leader);
    c.gap = gap;
    if (gap) c.missed = missed;
    return c;
  }

  // The server went back to a lower term than one reported (a failover to a
  // standby that had not received it): never reported; if a leader was
  // reported, the observer learns once that nobody leads, and waits for a
  // term above the highest it has seen.
  std::optional<LeaderChange> nobody_after_rollback() {
    if (!leading_) return std::nullopt;
    const Fence ended = leading_term_;
    leading_ = false;
    LeaderChange c;
    c.event = LeaderEvent::vacated;
    c.term = ended;
    c.change = last_change_;
    c.gap = true;
    return c;
  }

  bool started_ = false;
  bool leading_ = false;
  Fence leading_term_ = 0;
  Fence top_term_ = 0;
  std::int64_t last_change_ = 0;
  Fence last_term_ = 0;     // the term and value as of last_change_
  std::string last_value_;
};

}  // namespace pgmutex::detail
