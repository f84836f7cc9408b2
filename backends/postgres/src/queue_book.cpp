// The session's waiters in locks' queues (issue 17): their places, each
// taken on the I/O thread together with the book's entry for it, and their
// waits. A waiter blocks on a condition variable and makes no statement:
// the I/O thread, which reads every NOTIFY of the connection, hands a
// release's offer to the one place it names (its turn), tells the runner-up
// when to look at a late head, and tells every place of a connection that
// went to look (its place died with that connection's server backend).
// Their liveness is the session's connection: one server backend vouches
// for every waiter of the session, and its end ends them all at once. An
// async waiter (AsioMutex) is woken the same way by a callback, its
// timers kept by the I/O thread.
#include <algorithm>

#include "queue_rules.hpp"
#include "session_core.hpp"

namespace pgmutex::postgres_detail {

Result<QueuePlace> SessionCore::enqueue(const AcquireRequest& request, std::chrono::nanoseconds handoff_deadline) {
  std::optional<Result<QueuePlace>> taken;
  const auto body = [&](OwnSession& own) {
    taken = io_backend_->enqueue(request, handoff_deadline);
    if (!*taken) return;
    Place place;
    place.lock_name = std::string(request.lock.lock_name);
    place.epoch = epoch();  // the connection the place is bound to
    place.handoff = handoff_deadline;
    place.near = (*taken)->ahead <= 1;
    place.lease_kept = SharedAccess::lease_kept(*io_backend_, (*taken)->ticket);
    // The runner-up of a standing offer (the enqueue says): no NOTIFY names it.
    place.probe_at = SharedAccess::take_probe(*io_backend_, (*taken)->ticket);
    if (place.probe_at) place.near = true;
    place.poll_delay = first_look;
    // The enqueue LISTENed already: this only names the channel (no
    // statement), unless the connection went meanwhile, which the epoch tells.
    if (!own.unnamed())
      if (auto channel = SharedAccess::listen(*io_backend_, request.lock)) place.channel = std::move(*channel);
    std::lock_guard lock(mutex_);
    places_.insert_or_assign({std::string(request.lock.table), (*taken)->ticket}, std::move(place));
  };
  const auto queued_until = std::chrono::steady_clock::now() + options_.postgres.default_timeout;
  if (!call(body, queued_until) || !taken)
    return fail(Errc::backend_unavailable, "enqueue for lock '" + std::string(request.lock.lock_name) +
                                               "': the session's connection was busy until the deadline (or the session stopped)");
  return std::move(*taken);
}

SessionCore::Place& SessionCore::place_of(const WatchRequest& w, std::int64_t ticket) {
  auto [found, unknown] = places_.try_emplace(std::pair<std::string, std::int64_t>(std::string(w.lock.table), ticket));
  Place& place = found->second;
  if (unknown) {
    // Not taken by this session's enqueue (or forgotten): nothing will be
    // handed to it, so it looks with backoff, as a head would.
    place.lock_name = std::string(w.lock.lock_name);
    place.near = true;
    place.poll_delay = first_look;
  }
  return place;
}

bool SessionCore::take_offer(std::string_view table, std::int64_t ticket) noexcept {
  std::lock_guard lock(mutex_);
  const auto found = places_.find(std::pair<std::string, std::int64_t>(std::string(table), ticket));
  if (found == places_.end() || !found->second.offered) return false;
  found->second.offered = false;
  return true;
}

void SessionCore::watch_head(std::string_view table, std::int64_t ticket, Deadline probe_at) noexcept {
  std::lock_guard lock(mutex_);
  const auto found = places_.find(std::pair<std::string, std::int64_t>(std::string(table), ticket));
  if (found == places_.end()) return;
  found->second.near = true;
  found->second.probe_at = probe_at;
}

void SessionCore::forget_place(std::string_view table, std::int64_t ticket) noexcept {
  std::lock_guard lock(mutex_);
  places_.erase(std::pair<std::string, std::int64_t>(std::string(table), ticket));
}

Result<QueueWake> SessionCore::wait_in_queue(const WatchRequest& w, std::int64_t ticket,
                                             std::chrono::nanoseconds timeout, std::stop_token stop) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::max(timeout, std::chrono::nanoseconds::zero());
  StoppableWait wait(mutex_, std::move(stop));
  const bool& stopped = wait.stopped;
  std::condition_variable& cv = wait.cv;
  std::unique_lock lock(mutex_);
  Place& place = place_of(w, ticket);
  const StoppableWait::Registered registered(place.waiting, wait);
  place.holder_changed = false;  // the holder this wait's request describes is the current one
  // When to look unwoken (queue_rules.hpp): the net, or the holder's stale deadline.
  const auto stale_at = [&] {
    return unwoken_look(start, w.stale_threshold, w.holder_stale_in, place.near && !place.holder_changed);
  };
  const auto ended = [&]() -> std::optional<Result<QueueWake>> {
    if (stopped) return QueueWake::stopped;
    if (stopping_)
      return fail(Errc::backend_unavailable, "wait in the queue of lock '" + place.lock_name + "': the session stopped");
    return std::nullopt;
  };
  if (place.channel.empty()) {
    // No LISTEN here: look after a backoff (the queued try keeps the place's lease).
    auto until = std::min(deadline, start + place.poll_delay);
    until = std::min(until, stale_at());
    place.poll_delay = std::min(place.poll_delay * 2, longest_look);
    cv.wait_until(lock, until, [&] { return stopped || stopping_; });
    if (auto end = ended()) return std::move(*end);
    return std::chrono::steady_clock::now() >= deadline ? QueueWake::timed_out : QueueWake::look;
  }
  for (;;) {
    if (auto end = ended()) return std::move(*end);
    if (place.woke) {
      const QueueWake why = *place.woke;
      place.woke.reset();
      return why;
    }
    auto wake_at = deadline;
    if (place.probe_at) wake_at = std::min(wake_at, *place.probe_at);
    wake_at = std::min(wake_at, stale_at());
    // A place kept by a lease looks before the lease lapses (as
    // PostgresBackend::wait_in_queue's): a release would sweep it.
    if (place.lease_kept) wake_at = std::min(wake_at, start + lease_look);
    const auto now = std::chrono::steady_clock::now();
    if (now >= wake_at) {
      if (place.probe_at && now >= *place.probe_at) {
        place.probe_at.reset();
        return QueueWake::look;  // the head let its handoff deadline pass, maybe
      }
      if (now >= deadline) return QueueWake::timed_out;
      return QueueWake::look;  // the holder's stale deadline
    }
    cv.wait_until(lock, wake_at);
  }
}

Result<void> SessionCore::wait_in_queue_async(const WatchRequest& w, std::int64_t ticket,
                                              std::function<void(QueueWake)> woken) {
  if (!woken) return fail(Errc::invalid_argument, "an async wait in the queue needs a callback");
  const auto now = std::chrono::steady_clock::now();
  std::optional<QueueWake> at_once;
  {
    std::lock_guard lock(mutex_);
    if (stopping_)
      return fail(Errc::backend_unavailable, "wait in the queue of lock '" + std::string(w.lock.lock_name) +
                                                 "': the session stopped");
    Place& place = place_of(w, ticket);
    place.holder_changed = false;
    place.stale_at.reset();
    if (place.near && w.holder_stale_in) place.stale_at = now + *w.holder_stale_in;
    Deadline look = net_look(now, w.stale_threshold);  // the net every waiter has (queue_rules.hpp)
    if (place.lease_kept) look = std::min(look, now + lease_look);
    if (place.channel.empty()) {
      look = std::min(look, now + place.poll_delay);
      place.poll_delay = std::min(place.poll_delay * 2, longest_look);
    }
    place.look_at = look;
    if (place.woke) {
      at_once = *place.woke;
      place.woke.reset();
    } else {
      place.async_woken = std::move(woken);
      // The I/O thread's next timer may be this place's. Under the lock: the
      // callback may own the session's last share (session_core.cpp, run_job).
      wake();
    }
  }
  if (at_once) woken(*at_once);
  return {};
}

bool SessionCore::cancel_queue_wait(std::string_view table, std::int64_t ticket) noexcept {
  std::function<void(QueueWake)> dropped;  // destroyed outside the lock: it may own the waiter's operation
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return true;  // stop() dropped it: it never runs
    auto found = places_.find(std::pair<std::string, std::int64_t>(std::string(table), ticket));
    if (found == places_.end() || !found->second.async_woken) return false;
    dropped = std::move(found->second.async_woken);
    found->second.async_woken = nullptr;
  }
  return true;
}

std::optional<Deadline> SessionCore::async_due(const Place& place) {
  if (!place.async_woken) return std::nullopt;
  std::optional<Deadline> due = place.probe_at;
  const auto sooner = [&](const std::optional<Deadline>& t) {
    if (t && (!due || *t < *due)) due = t;
  };
  if (!place.holder_changed) sooner(place.stale_at);
  sooner(place.look_at);
  return due;
}

void SessionCore::wake_due_places(Deadline now) {
  std::vector<std::function<void(QueueWake)>> calls;
  {
    std::lock_guard lock(mutex_);
    for (auto& [key, place] : places_) {
      const auto due = async_due(place);
      if (!due || *due > now) continue;
      if (place.probe_at && *place.probe_at <= now) place.probe_at.reset();
      calls.push_back(std::move(place.async_woken));
      place.async_woken = nullptr;
    }
  }
  for (auto& call : calls) call(QueueWake::look);  // no lock held: the waiter may call back in
}

void SessionCore::dispatch_to_places(const std::vector<Notification>& notes) {
  const std::uint64_t now_epoch = epoch();
  std::vector<std::pair<std::string, std::string>> listen_again;  // table, lock
  std::vector<std::pair<std::function<void(QueueWake)>, QueueWake>> calls;  // async waiters woken
  {
    std::lock_guard lock(mutex_);
    if (places_.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    const auto tell = [&calls](Place& place, QueueWake why) {
      if (place.async_woken) {
        calls.emplace_back(std::move(place.async_woken), why);
        place.async_woken = nullptr;
        return;
      }
      if (place.woke != QueueWake::turn) place.woke = why;  // a turn is never taken back by a look
      if (place.waiting) place.waiting->notify_all();
    };
    for (const Notification& note : notes) {
      const auto offer = offer_of(note.payload);
      bool heard = false;
      for (auto& [key, place] : places_) {
        if (place.channel != note.channel) continue;
        heard = true;
        if (note.payload.empty()) {
          tell(place, QueueWake::look);  // the row went and nobody was offered it
          continue;
        }
        if (!offer) continue;
        if (offer->head == key.second) {
          place.offered = true;
          tell(place, QueueWake::turn);
          continue;
        }
        if (offer->head > key.second) {  // passed over or not seen: a look re-attaches it or finds it lost
          tell(place, QueueWake::look);
          continue;
        }
        // Only a waiter whose timers change is woken to reset them: the
        // runner-up, and a near one whose probe or stale deadline lapses.
        const bool timers_change = offer->runner_up == key.second || place.probe_at ||
                                   (place.near && !place.holder_changed);
        place.holder_changed = true;
        if (offer->runner_up == key.second) {
          place.near = true;
          place.probe_at = probe_time(now, offer->head_handoff, place.handoff);
        } else {
          place.probe_at.reset();  // another head, another runner-up: theirs to watch
        }
        if (timers_change && place.waiting) place.waiting->notify_all();
      }
      if (heard) ++notifications_;
    }
    // A place bound to a connection that went died with its server backend:
    // a queued try says so (the waiter takes another). On a connection up
    // now, its channel is LISTENed again first, should the place live on.
    for (auto& [key, place] : places_) {
      if (place.channel.empty() || place.epoch == now_epoch) continue;
      place.epoch = now_epoch;
      if (now_epoch != 0) listen_again.emplace_back(key.first, place.lock_name);
      tell(place, QueueWake::look);
    }
  }
  for (auto& [call, why] : calls) call(why);  // no lock held: the waiter may call back in
  for (const auto& [table, lock_name] : listen_again)
    (void)SharedAccess::listen(*io_backend_, LockRef{table, lock_name});  // failed: the connection went again, and is met then
}

}  // namespace pgmutex::postgres_detail
