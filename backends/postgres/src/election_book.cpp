// The session's election observers (issue 18): observers of many elections,
// however many, served by one LISTEN per election on the session's one
// connection. Each NOTIFY carries a whole change (election_rules.hpp); the
// I/O thread parses it once and hands it to the box of every observer of
// that election, whose wait wakes on a condition variable: no statement per
// change. A box whose connection went is deaf (its LISTEN died with it): its
// next wait LISTENs on the new connection and says resync, and the observer
// reads who leads, so what was announced meanwhile comes as a gap, never lost.
// Their readings of who leads (at a start, a resync, a leader's stale
// deadline) are shared: callers that ask before a reading begins join it.
#include <algorithm>

#include "election_rules.hpp"
#include "session_core.hpp"

namespace pgmutex::postgres_detail {
namespace {
// How long a box on a connection that cannot LISTEN waits between readings
// (as PostgresBackend's observers on a pool).
constexpr std::chrono::nanoseconds unheard_poll = std::chrono::milliseconds(500);
}  // namespace

SessionCore::ElectionBoxId SessionCore::open_election_box() {
  std::lock_guard lock(mutex_);
  const ElectionBoxId id = next_election_box_++;
  election_boxes_.emplace(id, ElectionBox{});
  return id;
}

void SessionCore::close_election_box(ElectionBoxId id) noexcept {
  std::lock_guard lock(mutex_);
  election_boxes_.erase(id);
}

Result<ElectionWake> SessionCore::wait_for_election(ElectionBoxId id, LockRef lock_ref,
                                                    std::chrono::nanoseconds timeout, std::stop_token stop) {
  const std::string what = "wait for the election of lock '" + std::string(lock_ref.lock_name) + "'";
  bool listening = false;
  {
    std::lock_guard lock(mutex_);
    auto box = election_boxes_.find(id);
    if (box == election_boxes_.end()) return fail(Errc::invalid_argument, what + ": the observer's box is closed");
    listening = !box->second.channel.empty();
  }
  if (!listening) {
    // LISTEN on the I/O thread: no NOTIFY is dispatched between it and the
    // box's channel being set, so every change after the reading that
    // follows (the observer's, on resync) reaches the box.
    std::optional<Error> failed;
    bool cannot_listen = false;
    const auto body = [&](OwnSession& own) {
      if (auto connected = io_backend_->connect(); !connected) {
        failed = std::move(connected.error());
        return;
      }
      if (own.unnamed()) {
        cannot_listen = true;
        return;
      }
      auto channel = SharedAccess::listen(*io_backend_, lock_ref, "_e");
      if (!channel) {
        failed = std::move(channel.error());
        return;
      }
      std::lock_guard lock(mutex_);
      auto box = election_boxes_.find(id);
      if (box == election_boxes_.end()) return;
      box->second.channel = std::move(*channel);
      box->second.epoch = epoch();
      box->second.notices.clear();  // older than the reading that follows
    };
    const auto queued_until = std::chrono::steady_clock::now() + options_.postgres.default_timeout;
    if (!call(body, queued_until))
      return fail(Errc::backend_unavailable,
                  what + ": the session's connection was busy until the deadline (or the session stopped)");
    if (failed) return tl::unexpected(std::move(*failed));
    if (!cannot_listen) return ElectionWake{{}, true};
    // A transaction pooler's connection hears no NOTIFY: read again after a poll.
    StoppableWait wait(mutex_, std::move(stop));
    std::unique_lock lock(mutex_);
    wait.cv.wait_for(lock, std::clamp(timeout, std::chrono::nanoseconds::zero(), unheard_poll),
                     [&] { return wait.stopped; });
    return ElectionWake{{}, !wait.stopped};
  }

  // At most a day at a time: no overflow for "forever" (nanoseconds::max()).
  const auto deadline = std::chrono::steady_clock::now() +
                        std::clamp(timeout, std::chrono::nanoseconds::zero(), std::chrono::nanoseconds(std::chrono::hours(24)));
  StoppableWait wait(mutex_, std::move(stop));
  std::unique_lock lock(mutex_);
  auto found = election_boxes_.find(id);
  if (found == election_boxes_.end()) return fail(Errc::invalid_argument, what + ": the observer's box is closed");
  ElectionBox& box = found->second;  // std::map: stays put while others come and go
  const StoppableWait::Registered registered(box.waiting, wait);
  wait.cv.wait_until(lock, deadline,
                     [&] { return wait.stopped || stopping_ || !box.notices.empty() || box.channel.empty(); });
  if (stopping_) return fail(Errc::backend_unavailable, what + ": the session stopped");
  ElectionWake wake;
  wake.notices = std::move(box.notices);
  box.notices.clear();
  wake.resync = wake.notices.empty() && box.channel.empty();  // deaf: its connection went
  return wake;
}

Result<LeaderRecord> SessionCore::read_leader(LockRef lock_ref, std::chrono::nanoseconds stale_threshold) {
  // On the I/O thread (an async operation's job) never join: the reading
  // joined could only begin after this job, which would wait for it.
  if (on_io_thread()) return io_backend_->leader(lock_ref, stale_threshold);
  const LeaderReadingKey key{std::string(lock_ref.table), std::string(lock_ref.lock_name), stale_threshold.count()};
  std::shared_ptr<LeaderReading> reading;
  bool mine = false;  // this caller sends it; the others join until it begins
  {
    std::lock_guard lock(mutex_);
    auto& pending = leader_readings_[key];
    if (!pending) {
      pending = std::make_shared<LeaderReading>();
      mine = true;
    }
    reading = pending;
  }
  const auto begun = [&] {  // mutex_ held: later callers start a reading of their own
    auto it = leader_readings_.find(key);
    if (it != leader_readings_.end() && it->second == reading) leader_readings_.erase(it);
  };
  if (mine) {
    const auto body = [&](OwnSession&) {
      {
        std::lock_guard lock(mutex_);
        begun();
      }
      auto answer = io_backend_->leader(lock_ref, stale_threshold);
      std::lock_guard lock(mutex_);
      reading->answer = std::move(answer);
      reading->done.notify_all();
    };
    const bool ran = call(body, std::chrono::steady_clock::now() + options_.postgres.default_timeout);
    std::lock_guard lock(mutex_);
    if (!ran) {
      begun();
      reading->answer = fail(Errc::backend_unavailable,
                             "read who leads lock '" + std::string(lock_ref.lock_name) +
                                 "': the session's connection was busy until the deadline (or the session stopped)");
      reading->done.notify_all();
    }
  }
  std::unique_lock lock(mutex_);
  reading->done.wait(lock, [&] { return reading->answer.has_value() || stopping_; });
  if (!reading->answer)
    return fail(Errc::backend_unavailable, "read who leads lock '" + std::string(lock_ref.lock_name) + "': the session stopped");
  return *reading->answer;
}

void SessionCore::dispatch_to_election_boxes(const std::vector<Notification>& notes) {
  const std::uint64_t now_epoch = epoch();
  std::lock_guard lock(mutex_);
  if (election_boxes_.empty()) return;
  for (const Notification& note : notes) {
    // Parsed once for every box of the election.
    std::optional<ElectionNotice> notice;
    bool heard = false;
    for (auto& [id, box] : election_boxes_) {
      if (box.channel != note.channel) continue;
      if (!heard) notice = election_notice_of(note.payload);
      heard = true;
      if (!notice) continue;  // not a change (a malformed payload): nothing to hand over
      box.notices.push_back(*notice);
      if (box.waiting != nullptr) box.waiting->notify_all();
    }
    if (heard) ++notifications_;
  }
  // A box LISTENing on a connection that is gone hears nothing more: its
  // next wait LISTENs again and says resync.
  for (auto& [id, box] : election_boxes_) {
    if (box.channel.empty() || box.epoch == now_epoch) continue;
    box.channel.clear();
    if (box.waiting != nullptr) box.waiting->notify_all();
  }
}

}  // namespace pgmutex::postgres_detail
