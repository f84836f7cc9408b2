// The session's election observers (issue 18): observers of many elections,
// however many, served by one LISTEN per election on the session's one
// connection. Each NOTIFY carries a whole change (election_rules.hpp); the
// I/O thread parses it once and hands it to the box of every observer of
// that election, whose wait wakes on a condition variable: no statement per
// change. A box whose connection went is deaf (its LISTEN died with it): its
// next wait LISTENs on the new connection and says resync, and the observer
// reads who leads, so what was announced meanwhile comes as a gap, never lost.
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
    std::mutex m;
    std::condition_variable cv;
    bool stopped = false;
    std::stop_callback on_stop(std::move(stop), [&] {
      std::lock_guard lock(m);
      stopped = true;
      cv.notify_all();
    });
    std::unique_lock lock(m);
    cv.wait_for(lock, std::clamp(timeout, std::chrono::nanoseconds::zero(), unheard_poll), [&] { return stopped; });
    return ElectionWake{{}, !stopped};
  }

  // At most a day at a time: no overflow for "forever" (nanoseconds::max()).
  const auto deadline = std::chrono::steady_clock::now() +
                        std::clamp(timeout, std::chrono::nanoseconds::zero(), std::chrono::nanoseconds(std::chrono::hours(24)));
  std::condition_variable cv;
  bool stopped = false;
  // Made before the lock is taken: a stop requested already runs it at once.
  std::stop_callback on_stop(std::move(stop), [&] {
    std::lock_guard lock(mutex_);
    stopped = true;
    cv.notify_all();
  });
  std::unique_lock lock(mutex_);
  auto found = election_boxes_.find(id);
  if (found == election_boxes_.end()) return fail(Errc::invalid_argument, what + ": the observer's box is closed");
  ElectionBox& box = found->second;  // std::map: stays put while others come and go
  box.waiting = &cv;
  struct Unregister {
    ElectionBox& box;
    ~Unregister() { box.waiting = nullptr; }
  } unregister{box};
  cv.wait_until(lock, deadline,
                [&] { return stopped || stopping_ || !box.notices.empty() || box.channel.empty(); });
  if (stopping_) return fail(Errc::backend_unavailable, what + ": the session stopped");
  ElectionWake wake;
  wake.notices = std::move(box.notices);
  box.notices.clear();
  wake.resync = wake.notices.empty() && box.channel.empty();  // deaf: its connection went
  return wake;
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
