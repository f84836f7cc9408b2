// PostgresBackend's queue (issue 17): taking a place (LISTEN, then the
// enqueue), leaving it (and passing on an offer that raced the leaving),
// and waiting in line without a statement: poll() on the connection's
// socket until a release names this ticket, a stop, or a timer of the
// head or runner-up. A backend that cannot LISTEN (a pool's connection, a
// transaction pooler's) looks with backoff instead. A pgmutex::Session's
// waiters take their places here too, and wait in queue_book.cpp.
#include <algorithm>
#include <optional>
#include <poll.h>

#include "backend_impl.hpp"
#include "queue_rules.hpp"
#include "statement_values.hpp"
#include "stop_fd.hpp"

namespace pgmutex {

using namespace postgres_detail;

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

Result<QueuePlace> PostgresBackend::enqueue(const AcquireRequest& request,
                                            std::chrono::nanoseconds handoff_deadline) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<QueuePlace>(
      request.lock.table, "enqueue for " + lock_context(request.lock), Effect::write, request.timeout,
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<QueuePlace> {
        // LISTEN before the place is taken: a release after it is heard.
        // A waiter on a connection of its own LISTENs on its own channel,
        // which a release names only when it offers to it or makes it the
        // runner-up (notify_offer in queue_sql.cpp): the other waiters'
        // processes are not woken by every handoff. A pgmutex::Session's
        // connection LISTENs on the lock's channel: its I/O thread hands the
        // offers to its waiters (queue_book.cpp).
        const bool listens = (impl_->own.has_value() || impl_->core != nullptr) && !session.unnamed();
        const int own_pid = listens && impl_->core == nullptr ? session.reported_backend_pid() : 0;
        if (listens) {
          auto oid = session.table_oid(request.lock.table, bound);
          if (!oid) return tl::unexpected(std::move(oid.error()));
          auto& own = dynamic_cast<OwnSession&>(session);
          const std::string channel = postgres_detail::release_channel(*oid, request.lock.lock_name);
          std::vector<std::string> channels{channel};
          if (own_pid != 0) channels = {own_channel(channel, own_pid), vacancy_channel(channel)};
          auto listened = own.listen(channels, bound);
          if (!listened) return tl::unexpected(std::move(listened.error()));
          // What these channels carried before now (from an earlier wait of
          // this connection) is older than the enqueue's snapshot, which
          // sees its outcome: not a wake-up of the place about to be taken.
          // The lock's channel too, where a place not bound to this
          // backend waits (queue_waits' wait, below). A Session's I/O
          // thread reads its connection's notifications itself.
          if (own_pid != 0) {
            for (const std::string& c : channels) (void)own.take_payloads(c);
            (void)own.take_payloads(channel);
          }
        }
        const HolderDetails& given = request.holder_details;
        auto rows = session.run(
            st.enqueue,
            {std::string(request.lock.lock_name), std::string(request.instance_id), seconds_param(request.stale_threshold),
             token_param(request.token), seconds_param(handoff_deadline), seconds_param(pooled_lease),
             std::to_string(listens ? session.reported_backend_pid() : 0),
             given.host.empty() ? impl_->host : std::string(given.host),
             std::to_string(given.pid != 0 ? given.pid : static_cast<std::int64_t>(::getpid())),
             given.command.empty() ? impl_->options.holder_command : std::string(given.command)},
            bound);
        if (!rows) return tl::unexpected(std::move(rows.error()));
        if (listens) {
          // While it waits: the statements of its handoff, parsed now rather
          // than after the release that wakes it (a fresh connection's Parse
          // of the queued try took 4 ms there), the confirm first. A failure
          // here is not the enqueue's: the place is taken, a closed
          // connection is found by the wait, and a statement not prepared is
          // prepared when it runs.
          auto& own = dynamic_cast<OwnSession&>(session);
          const bool e = impl_->campaigns;
          const Statement& confirm = e ? st.election_confirm_offer : st.confirm_offer;
          const Statement& release = e ? st.election_release : st.release;
          // The release planned once per connection too (a pgmutex run
          // --wait's is fresh): a fresh connection's first planning of it,
          // between the command's end and the next holder's start, took 2-4
          // ms. The confirm's custom plan is short, and one planned ahead is
          // not kept: only generic plans make planning it ahead pay (0.6 ms).
          if (own.prepare(confirm, bound) && own.prepare(e ? st.election_acquire_queued : st.acquire_queued, bound) &&
              own.prepare(release, bound))
            (void)(impl_->options.generic_plans_for_handoff ? own.plan_ahead({&confirm, &release}, bound)
                                                            : own.plan_ahead({&release}, bound));
        }
        QueuePlace place;
        place.ticket = std::stoll(rows->text(0, 0));
        place.ahead = std::stoll(rows->text(0, 1));
        place.try_now = rows->text(0, 2) == "t";
        auto& here = impl_->queued_entry(place.ticket);
        here.pid_bound = listens && rows->text(0, 3) == "t";
        here.channel_pid = here.pid_bound ? own_pid : 0;
        here.near = place.ahead <= 1;
        here.handoff = handoff_deadline;
        here.poll_delay = first_look;
        here.probe_at.reset();
        if (!rows->is_null(0, 4)) {  // the runner-up of a standing offer that no NOTIFY will name it in
          here.near = true;
          here.probe_at = probe_time(Clock::now(), std::chrono::milliseconds(std::stoll(rows->text(0, 4))), handoff_deadline);
        }
        return place;
      });
}

Result<void> PostgresBackend::dequeue(const AcquireRequest& request, std::int64_t ticket) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<void>(
      request.lock.table, "leave the queue of " + lock_context(request.lock), Effect::idempotent_write, request.timeout,
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<void> {
        impl_->queued_here.erase(ticket);
        // The lock's hash names its channel: a runner-up that leaves tells the next waiter.
        const std::vector<std::string> key{std::string(request.lock.lock_name), std::to_string(ticket),
                                           token_param(request.token), lock_hash(request.lock.lock_name)};
        std::optional<std::string> offered;
        // Twice at most: a release that offered us the lock while the first
        // ran may leave it reading neither "left" nor "offered".
        for (int tries = 0; tries < 2; ++tries) {
          auto rows = session.run(st.dequeue, key, bound);
          if (!rows) return tl::unexpected(std::move(rows.error()));
          if (rows->text(0, 0) == "t") {
            // Gone. A release that named us the runner-up as we left, or a
            // waiter that joined behind us, is not in the dequeue's view:
            // look again (queue_sql.cpp). Its failure is reported, though
            // the place is gone: the waiter behind may not have been told.
            if (rows->text(0, 3) == "t")
              if (auto told = session.run(st.hand_on, key, bound); !told) return tl::unexpected(std::move(told.error()));
            return {};
          }
          if (!rows->is_null(0, 1)) {
            offered = rows->text(0, 1);
            break;
          }
        }
        if (!offered) {
          // Gone already: swept, or our own DELETE committed and its reply
          // was lost (this is the retry). That DELETE may have asked for the
          // second look, which its lost reply did not tell us: take it.
          // Harmless otherwise (it names nobody, or the waiter that is the
          // runner-up already).
          if (auto told = session.run(st.hand_on, key, bound); !told) return tl::unexpected(std::move(told.error()));
          return {};
        }
        // Offered meanwhile: pass it on as its holder would (the release
        // sweeps our offered place too).
        auto passed = session.run(st.release,
                                  {std::string(request.lock.lock_name), std::string(request.instance_id), *offered,
                                   token_param(request.token), lock_hash(request.lock.lock_name),
                                   bound.lock_timeout_param()},
                                  bound);
        if (!passed) return tl::unexpected(std::move(passed.error()));
        return {};
      });
}

Result<QueueWake> PostgresBackend::wait_in_queue(const WatchRequest& w, std::int64_t ticket,
                                                 std::chrono::nanoseconds timeout, std::stop_token stop) noexcept {
  if (!impl_) return moved_from();
  if (auto valid = validate_table_name(w.lock.table); !valid) return tl::unexpected(std::move(valid.error()));
  try {
    std::lock_guard lock(impl_->mutex);
    const auto start = Clock::now();
    const auto deadline = start + std::max(timeout, std::chrono::nanoseconds::zero());
    StopFd stopped(stop);
    auto& here = impl_->queued_here[ticket];
    if (here.handoff == std::chrono::nanoseconds::zero()) here.near = true;  // unknown place: as a head
    // An offer to another waiter came: the holder the last try saw is gone,
    // and its deadline with it (the runner-up's probe looks at the new one).
    bool holder_changed = false;
    // When to look unwoken (queue_rules.hpp): the net, or the holder's stale deadline.
    const auto stale_at = [&] {
      return unwoken_look(start, w.stale_threshold, w.holder_stale_in, here.near && !holder_changed);
    };
    auto sleep_until = [&](Clock::time_point until) -> bool {  // true: stopped
      for (;;) {
        const auto left = until - Clock::now();
        if (left <= std::chrono::nanoseconds::zero()) return false;
        pollfd p{stopped.fd(), POLLIN, 0};
        const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
        const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(ms, 1 << 30)));
        if (n > 0) return true;
      }
    };
    if (!impl_->own || impl_->own->unnamed()) {
      // No LISTEN here: look after a backoff (the queued try keeps the place's lease).
      auto until = std::min(deadline, start + here.poll_delay);
      until = std::min(until, stale_at());
      here.poll_delay = std::min(here.poll_delay * 2, longest_look);
      if (sleep_until(until)) return QueueWake::stopped;
      return Clock::now() >= deadline ? QueueWake::timed_out : QueueWake::look;
    }
    OwnSession& own = *impl_->own;
    const Bound bound = Bound::from(impl_->bound_of({}));
    auto failed = [&](StatementFailure failure) -> Result<QueueWake> {
      return tl::unexpected(to_error(failure, "wait in the queue of " + lock_context(w.lock), Effect::read,
                                     impl_->secrets));
    };
    if (!own.connected()) return fail(Errc::backend_unavailable, "wait in the queue of " + lock_context(w.lock) +
                                                                     ": the connection is closed");
    auto oid = own.table_oid(w.lock.table, bound);
    if (!oid) return failed(std::move(oid.error()));
    // Offers name this waiter on its own channel while its place is bound
    // to this connection's backend (its pid in the place), and a lock left
    // free says so on the vacancy channel; otherwise (behind a session
    // pooler, or on a new connection until a look re-attaches the place, or
    // never, while the old backend lives) both come on the lock's channel.
    const std::string lock_channel = postgres_detail::release_channel(*oid, w.lock.lock_name);
    const int pid = own.reported_backend_pid();
    const bool on_own_channel = here.channel_pid != 0 && here.channel_pid == pid;
    const std::vector<std::string> channels =
        on_own_channel ? std::vector<std::string>{own_channel(lock_channel, pid), vacancy_channel(lock_channel)}
                       : std::vector<std::string>{lock_channel};
    if (!std::all_of(channels.begin(), channels.end(), [&](const std::string& c) { return own.listening(c); })) {
      // A new connection: LISTEN, then look once, since an offer made
      // before the LISTEN was not heard.
      if (auto listened = own.listen(channels, bound); !listened) return failed(std::move(listened.error()));
      return QueueWake::look;
    }
    const auto take_payloads = [&] {
      std::vector<std::string> payloads;
      for (const std::string& channel : channels)
        for (std::string& payload : own.take_payloads(channel)) payloads.push_back(std::move(payload));
      return payloads;
    };
    for (;;) {
      for (const std::string& payload : take_payloads()) {
        if (payload.empty()) return QueueWake::look;  // the row went and nobody was offered it
        const auto offer = offer_of(payload);
        if (!offer) continue;
        if (offer->head == ticket) {
          here.offered = true;
          return QueueWake::turn;
        }
        // An offer to a waiter behind us, none to us: our place was passed
        // over (judged dead: a reconnect whose old backend lived on, a
        // lapsed lease) or not seen. A look re-attaches it or finds it lost.
        if (offer->head > ticket) return QueueWake::look;
        holder_changed = true;
        if (offer->runner_up == ticket) {
          here.near = true;
          here.probe_at = probe_time(Clock::now(), offer->head_handoff, here.handoff);
        } else {
          here.probe_at.reset();  // another head, another runner-up: theirs to watch
        }
      }
      auto wake_at = deadline;
      if (here.probe_at) wake_at = std::min(wake_at, *here.probe_at);
      wake_at = std::min(wake_at, stale_at());
      // A place kept by a lease lives while its queued tries renew it: look
      // before it lapses, or a release counts it dead and sweeps it.
      if (here.lease_kept()) wake_at = std::min(wake_at, start + lease_look);
      auto woke = own.await_input(wake_at, stopped.fd());
      if (!woke) return failed(std::move(woke.error()));
      if (*woke == PqConnection::Woke::wake_fd) return QueueWake::stopped;
      if (*woke == PqConnection::Woke::input) continue;
      const auto now = Clock::now();
      if (here.probe_at && now >= *here.probe_at) {
        here.probe_at.reset();
        return QueueWake::look;  // the head let its handoff deadline pass, maybe
      }
      if (now >= deadline) return QueueWake::timed_out;
      return QueueWake::look;  // the holder's stale deadline
    }
  } catch (...) {
    return tl::unexpected(to_error(failure_from_current_exception(), "wait in the queue of " + lock_context(w.lock),
                                   Effect::read, impl_->secrets));
  }
}

void SharedAccess::offered(PostgresBackend& backend, std::int64_t ticket) noexcept {
  if (!backend.impl_) return;
  std::lock_guard lock(backend.impl_->mutex);
  // The Session's I/O thread took the place on a backend of its own, so the
  // entry may be new here; the try that confirms (or finds the place lost)
  // erases it.
  try {
    backend.impl_->queued_entry(ticket).offered = true;
  } catch (...) {  // out of memory: the whole queued try confirms as well
  }
}

std::optional<std::chrono::steady_clock::time_point> SharedAccess::take_probe(PostgresBackend& backend,
                                                                               std::int64_t ticket) noexcept {
  if (!backend.impl_) return std::nullopt;
  std::lock_guard lock(backend.impl_->mutex);
  const auto found = backend.impl_->queued_here.find(ticket);
  if (found == backend.impl_->queued_here.end()) return std::nullopt;
  return std::exchange(found->second.probe_at, std::nullopt);
}

bool SharedAccess::lease_kept(PostgresBackend& backend, std::int64_t ticket) noexcept {
  if (!backend.impl_) return false;
  std::lock_guard lock(backend.impl_->mutex);
  const auto found = backend.impl_->queued_here.find(ticket);
  return found != backend.impl_->queued_here.end() && found->second.lease_kept();
}

static_assert(BackendWaitsInQueue<PostgresBackend>);

}  // namespace pgmutex
