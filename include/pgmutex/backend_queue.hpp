// The backend contract's queue (issue 17): how waiters stand in line for a
// lock, are offered it in turn and confirm, and how an operator lists them.
// Included by pgmutex/backend.hpp, whose types it speaks.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "pgmutex/backend.hpp"

namespace pgmutex {

// --- Queues: waiting in line (FIFO, one wake-up per release).
//
// A waiter that lost a plain try enqueues: it takes a place (a ticket) in the
// lock's queue, and a release then hands the lock to the first live waiter
// in place: it offers the grant (a fresh fence, the waiter's token) and wakes
// that waiter alone, which confirms by a queued try. A waiter whose
// connection closed is skipped at once; one that does not confirm within its
// handoff deadline loses its turn. A plain try loses to any live waiter.
// Skipping a waiter costs fairness only: every grant is still a row written
// under the table's rules, with a fresh, higher fence.

// A waiter's place in the queue.
struct QueuePlace {
  std::int64_t ticket = 0;  // order in the queue; never 0
  // When the waiter should try (a queued try) at once, without a wake-up:
  // the lock was free, stale or a lapsed offer when it queued.
  bool try_now = false;
  // Waiters ahead of it when it queued, dead ones included.
  std::int64_t ahead = 0;
};

// Why a queued waiter woke. turn: a release offered it the lock (its queued
// try confirms); look: the lock may be available without an offer to it (a
// release that named nobody, the holder's stale deadline, a late head's
// handoff deadline as its runner-up sees it, a reconnect): a queued try
// takes it if no live waiter is ahead, or passes it on to the first one;
// timed_out, stopped: the wait's limit passed or its stop token fired.
enum class QueueWake : unsigned char { turn, look, timed_out, stopped };

// The queue's statements. enqueue: LISTEN for the lock's wake-ups (where the
// backend is told of them), then take a place at the back, with
// `request.token` as the waiter token (the grant token of the grant it may
// get) and `handoff_deadline` as how long an offer to it waits. dequeue:
// leave the queue (a timeout, a cancellation); if a release offered this
// place the lock meanwhile, pass the offer on as a release would. Errors:
// the statement's, as a try's.
template <class B>
concept BackendQueuesWaiters =
    requires(B& b, const AcquireRequest& request, std::chrono::nanoseconds handoff_deadline, std::int64_t ticket) {
      { b.enqueue(request, handoff_deadline) } noexcept -> std::same_as<Result<QueuePlace>>;
      { b.dequeue(request, ticket) } noexcept -> std::same_as<Result<void>>;
    };

// A queue whose waiters block until woken, making no statement meanwhile
// but for the backend's own looks (Postgres: LISTEN on the waiter's
// connection, then poll() on its socket; a look at least once per stale
// threshold, and every 2.5 s for a place kept by a lease).
// `w.holder_stale_in`: when the holder's row goes stale, as the last try saw
// it (the backend may wake the waiter then with `look`).
template <class B>
concept BackendWaitsInQueue =
    BackendQueuesWaiters<B> && requires(B& b, const WatchRequest& w, std::int64_t ticket,
                                        std::chrono::nanoseconds timeout, std::stop_token stop) {
      { b.wait_in_queue(w, ticket, timeout, stop) } noexcept -> std::same_as<Result<QueueWake>>;
    };

// A queue that wakes a waiter by a callback instead of a blocked thread (an
// async acquire: Postgres, a pgmutex::Session's I/O thread). `woken` runs
// once, on the backend's thread (or inside the call, if the place already
// has its reason), with turn or look, as wait_in_queue would return; it
// must only queue work. cancel_queue_wait: true if it had not run and now
// never will. A backend that stops drops what it has not run.
template <class B>
concept BackendQueuesAsynchronously =
    BackendQueuesWaiters<B> && requires(B& b, const WatchRequest& w, std::int64_t ticket,
                                        std::function<void(QueueWake)> woken) {
      { b.wait_in_queue_async(w, ticket, std::move(woken)) } noexcept -> std::same_as<Result<void>>;
      { b.cancel_queue_wait(w.lock, ticket) } noexcept -> std::same_as<bool>;
    };

// A queue that says without blocking whether a waiter should wake, reading
// only what the backend already has (no statement): the mutex then sleeps
// on its executor between looks, poll_interval at most (the in-memory
// backend, whose server lives in the process). nullopt: not yet.
template <class B>
concept BackendPollsQueue =
    BackendQueuesWaiters<B> && requires(B& b, const WatchRequest& w, std::int64_t ticket) {
      { b.queue_wake(w, ticket) } noexcept -> std::same_as<std::optional<QueueWake>>;
    };

// One waiter in a lock's queue, as an administrator sees it.
struct QueuedWaiterRow {
  std::string lock_name;
  std::int64_t ticket = 0;    // order in the queue
  std::string instance_id;
  std::string host;           // as its request recorded it; empty: not recorded
  std::int64_t pid = 0;       // 0: not recorded
  double seconds_waiting = 0.0;  // server clock
  bool offered = false;       // a release offered it the lock; it has not confirmed yet
  bool alive = true;          // its connection is open (or, pooled, its lease is fresh)
};

// Every waiter of a table's queues, by lock name, then in queue order.
template <class B>
concept BackendListsQueue = requires(B& b, std::string_view table) {
  { b.list_queue(table) } noexcept -> std::same_as<Result<std::vector<QueuedWaiterRow>>>;
};

}  // namespace pgmutex
