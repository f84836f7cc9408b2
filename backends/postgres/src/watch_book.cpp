// The session's watches: waiters of many locks served by one LISTEN per lock
// on one connection. A watch is woken (once) by a NOTIFY on its lock's
// channel, by its holder's stale deadline (the row read then, one statement
// per table for every watch due), by a slow re-check that finds the row gone
// or stale (a NOTIFY missed), or by the loss of the connection (its LISTENs
// are gone: the waiter tries again, which reconnects and LISTENs anew). A
// connection lost between a watch's LISTEN and its read is met at once: it
// LISTENs and reads again on the fresh one.
#include <algorithm>
#include <set>

#include "pgmutex/options.hpp"
#include "session_core.hpp"

namespace pgmutex::postgres_detail {
namespace {

// A row is free for the waiter once gone, or older than the larger of its
// holder's threshold and the waiter's. Otherwise: how long until it is.
std::optional<std::chrono::nanoseconds> stale_in(const std::optional<LockRow>& row,
                                                 std::chrono::nanoseconds waiter_threshold) {
  if (!row) return std::nullopt;
  const auto threshold = std::max(row->stale_threshold, waiter_threshold);
  const auto age = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(row->seconds_since_heartbeat));
  if (age >= threshold) return std::nullopt;
  return threshold - age;
}

}  // namespace

Result<WatchId> SessionCore::add_watch(const WatchRequest& request, std::function<void()> woken) {
  if (auto valid = validate_table_name(request.lock.table); !valid) return tl::unexpected(std::move(valid.error()));
  if (auto valid = validate_lock_name(request.lock.lock_name); !valid) return tl::unexpected(std::move(valid.error()));
  if (request.stale_threshold < std::chrono::nanoseconds::zero())
    return fail(Errc::invalid_argument, "a watch's stale_threshold must not be negative");
  if (!woken) return fail(Errc::invalid_argument, "a watch needs a callback");
  WatchId id = 0;
  {
    std::lock_guard lock(mutex_);
    id = next_watch_++;
  }
  std::optional<Error> failed;
  // On the I/O thread: no NOTIFY is dispatched between the LISTEN, the read
  // of the row and the watch's entry, so a release after the waiter's last
  // try is seen either by the read or by the NOTIFY.
  const auto body = [&](OwnSession& own) {
    if (auto connected = io_backend_->connect(); !connected) {
      failed = std::move(connected.error());
      return;
    }
    std::string channel;
    std::uint64_t listened_on = 0;
    std::optional<LockRow> row;
    // The read is retried on a fresh connection if the one that LISTENed is
    // lost under it: that one hears no NOTIFY, so LISTEN and read again
    // there. Should the connection keep dropping, the watch keeps the epoch
    // it LISTENed on, and after_io wakes it (the waiter tries again).
    for (int attempt = 0;; ++attempt) {
      if (!own.unnamed()) {
        auto listened = SharedAccess::listen(*io_backend_, request.lock);
        if (!listened) {
          failed = std::move(listened.error());
          return;
        }
        channel = std::move(*listened);
      }
      listened_on = epoch();
      auto read = io_backend_->inspect(request.lock);
      ++rechecks_;
      if (!read) {
        failed = std::move(read.error());
        return;
      }
      row = std::move(*read);
      if (channel.empty() || epoch() == listened_on || attempt == 2) break;
    }
    const auto now = std::chrono::steady_clock::now();
    const auto left = stale_in(row, request.stale_threshold);
    Watch w{std::string(request.lock.table), std::string(request.lock.lock_name), std::move(channel),
            request.stale_threshold, std::nullopt, listened_on, std::move(woken)};
    if (left) w.check_at = now + std::min(*left, request.holder_stale_in.value_or(*left));
    {
      std::lock_guard lock(mutex_);
      if (watches_.empty()) next_recheck_ = now + recheck_every();
      watches_.emplace(id, std::move(w));
    }
    if (!left) wake_watches({id});  // free already: the waiter tries at once
  };
  const auto queued_until = std::chrono::steady_clock::now() + options_.postgres.default_timeout;
  if (!call(body, queued_until))
    return fail(Errc::backend_unavailable, "watch lock '" + std::string(request.lock.lock_name) +
                                               "': the session's connection was busy until the deadline (or the session stopped)");
  if (failed) return tl::unexpected(std::move(*failed));
  return id;
}

bool SessionCore::cancel_watch(WatchId id) noexcept {
  std::lock_guard lock(mutex_);
  return watches_.erase(id) == 1;
}

void SessionCore::wake_watches(const std::vector<WatchId>& ids) {
  std::vector<std::function<void()>> calls;
  {
    std::lock_guard lock(mutex_);
    for (WatchId id : ids) {
      auto found = watches_.find(id);
      if (found == watches_.end()) continue;  // cancelled, or woken already
      calls.push_back(std::move(found->second.woken));
      watches_.erase(found);
    }
    if (watches_.empty()) next_recheck_ = Deadline::max();
  }
  for (auto& woken : calls) woken();  // no lock held: the waiter may call back in
}

void SessionCore::after_io() {
  note_counts();
  const std::vector<Notification> notes = own_.take_notifications();
  dispatch_to_election_boxes(notes);
  dispatch_to_places(notes);
  const std::uint64_t now_epoch = epoch();
  std::vector<WatchId> to_wake;
  {
    std::lock_guard lock(mutex_);
    if (watches_.empty()) return;
    for (const Notification& note : notes) {
      bool any = false;
      for (const auto& [id, w] : watches_)
        if (w.channel == note.channel) {
          to_wake.push_back(id);
          any = true;
        }
      if (any) ++notifications_;
    }
    // A watch LISTENing on a connection that is gone hears nothing more.
    for (const auto& [id, w] : watches_)
      if (!w.channel.empty() && w.epoch != now_epoch) to_wake.push_back(id);
  }
  std::sort(to_wake.begin(), to_wake.end());
  to_wake.erase(std::unique(to_wake.begin(), to_wake.end()), to_wake.end());
  wake_watches(to_wake);
}

void SessionCore::check_watches(bool all) {
  const auto started = std::chrono::steady_clock::now();
  std::set<std::string> tables;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [id, w] : watches_)
      if (all || (w.check_at && *w.check_at <= started)) tables.insert(w.table);
    if (all) next_recheck_ = started + recheck_every();
  }
  std::vector<WatchId> to_wake;
  for (const std::string& table : tables) {
    auto rows = io_backend_->list(table);  // one statement for every watched lock of the table
    ++rechecks_;
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(mutex_);
    for (auto& [id, w] : watches_) {
      if (w.table != table || !(all || (w.check_at && *w.check_at <= started))) continue;
      if (!rows) {  // the waiter tries again, and meets the error itself
        to_wake.push_back(id);
        continue;
      }
      const std::string& name = w.lock_name;  // clang 15 cannot capture a structured binding
      const auto found =
          std::find_if(rows->begin(), rows->end(), [&name](const LockRow& r) { return r.lock_name == name; });
      const auto left =
          stale_in(found == rows->end() ? std::nullopt : std::optional<LockRow>(*found), w.stale_threshold);
      if (!left) to_wake.push_back(id);
      else w.check_at = now + *left;
    }
  }
  wake_watches(to_wake);
}

}  // namespace pgmutex::postgres_detail
