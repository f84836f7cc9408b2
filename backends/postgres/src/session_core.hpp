// The heart of pgmutex::Session: one OwnSession (one connection) driven by one
// I/O thread, which runs
//   - the statements every mutex of the session asks for (queued jobs, each
//     waited for by its caller, each bounded by its own deadline);
//   - the batched heartbeats (beat_batch.cpp);
//   - the watches of waiters: one LISTEN per lock, NOTIFYs dispatched by
//     channel, stale deadlines and slow re-checks (watch_book.cpp);
//   - the places of waiters in locks' queues: each release's offer handed
//     to the one place it names (queue_book.cpp).
// While idle it waits in poll() on the connection's socket, an eventfd (new
// work) and its next timer: no statement is sent for a waiter that waits.
// Private to the backend.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "own_session.hpp"
#include "shared_connection.hpp"
#include "pgmutex/backend.hpp"
#include "pgmutex/postgres_backend.hpp"
#include "pgmutex/session.hpp"

namespace pgmutex::postgres_detail {

class SessionCore;

// One blocked wait of a Session's caller (in line, or for an election's
// change): a condition variable on the core's mutex that a stop request
// wakes, `stopped` then true. Made before the mutex is taken: a stop
// requested already runs the callback at once, which takes it. Member order
// matters: the callback may run in the constructor, so `cv` and `stopped`
// come first.
class StoppableWait {
 public:
  StoppableWait(std::mutex& m, std::stop_token stop) : m_(m), on_stop_(std::move(stop), Wake{this}) {}
  StoppableWait(const StoppableWait&) = delete;
  StoppableWait& operator=(const StoppableWait&) = delete;

  // While it lives, `*slot` (a place's or a box's `waiting`, set under the
  // mutex) points at this wait's cv, so the I/O thread's dispatch wakes it.
  class [[nodiscard]] Registered {
   public:
    Registered(std::condition_variable*& slot, StoppableWait& wait) : slot_(slot) { slot_ = &wait.cv; }
    ~Registered() { slot_ = nullptr; }
    Registered(const Registered&) = delete;
    Registered& operator=(const Registered&) = delete;

   private:
    std::condition_variable*& slot_;
  };

 private:
  struct Wake {
    StoppableWait* wait;
    void operator()() const {
      std::lock_guard lock(wait->m_);
      wait->stopped = true;
      wait->cv.notify_all();
    }
  };
  std::mutex& m_;

 public:
  std::condition_variable cv;
  bool stopped = false;  // read and written under the mutex

 private:
  std::stop_callback<Wake> on_stop_;
};

// The way in to a session's core and a backend's durability mark, for the
// implementation and for tests of the rules that the public API cannot show.
struct SessionAccess {
  static SessionCore& core(pgmutex::Session& session) noexcept;
  static const std::shared_ptr<DurableMark>& mark(const SessionBackend& backend) noexcept;
};

class SessionCore : public SharedConnection {
 public:
  SessionCore(std::string dsn, SessionOptions options);
  SessionCore(const SessionCore&) = delete;
  SessionCore& operator=(const SessionCore&) = delete;
  ~SessionCore() override;

  // Starts the I/O thread, which owns `self` (this core) until it ends.
  void start(std::shared_ptr<SessionCore> self);
  // Ends the I/O thread; queued jobs then fail, pending beats and watches are dropped.
  void stop() noexcept;

  // Runs `body` on the I/O thread (see SharedConnection); on the I/O thread
  // itself, at once.
  bool call(const std::function<void(OwnSession&)>& body, Deadline queued_until) override;
  // Queues `job` to run on the I/O thread, owned by the queue and waited for
  // by nobody (SessionBackend::run_job); false once stopping (not queued).
  bool run_job(std::function<void()> job);

  // A heartbeat to send at the end of the current tick (see heartbeat_tick).
  struct Beat {
    std::string table, lock_name, instance_id;
    Fence fence = 0;
    GrantToken token = 0;
    std::chrono::nanoseconds timeout{0};
    Deadline deadline;  // past it, the beat fails unsent (backend_unavailable)
    std::shared_ptr<DurableMark> mark;
    BeatCallback done;
    bool durable = false;  // the mutex asks for a synchronous commit (HolderKey::durable)
  };
  // False once stopping: the beat is not taken.
  bool add_beat(Beat beat);

  // A waiter's watch: registered on the I/O thread (LISTEN, a read of the
  // row), then woken once by a NOTIFY, its stale deadline, a re-check or a
  // reconnect. Returns the registration's error, if any.
  Result<WatchId> add_watch(const WatchRequest& request, std::function<void()> woken);
  // True if the watch was still waiting (its callback never runs).
  bool cancel_watch(WatchId id) noexcept;

  // The queue (issue 17), for SessionBackend's waiters (queue_book.cpp).
  // enqueue: a place at the back of the lock's queue, taken on the I/O
  // thread (LISTEN, then the enqueue), and the book's entry for it, made
  // before any NOTIFY is dispatched: an offer to it that comes at once is kept.
  Result<QueuePlace> enqueue(const AcquireRequest& request, std::chrono::nanoseconds handoff_deadline);
  // Blocks until the I/O thread hands the place its turn or a reason to
  // look, the runner-up's or the holder's deadline passes, `timeout`
  // passes or `stop` fires: no statement. A session's connection that
  // cannot LISTEN (a transaction pooler's) looks with backoff instead.
  Result<QueueWake> wait_in_queue(const WatchRequest& w, std::int64_t ticket, std::chrono::nanoseconds timeout,
                                  std::stop_token stop);
  // As wait_in_queue, for an async waiter: `woken` runs once with turn or
  // look, on the I/O thread (or at once, if the place has its reason
  // already); the runner-up's and the holder's deadlines are the I/O
  // thread's timers. No timeout: the waiter keeps its own.
  Result<void> wait_in_queue_async(const WatchRequest& w, std::int64_t ticket, std::function<void(QueueWake)> woken);
  // True if the async wait had not been woken, or the session stopped (its
  // callback never runs).
  bool cancel_queue_wait(std::string_view table, std::int64_t ticket) noexcept;
  // The place is left, lost or granted: its entry goes.
  void forget_place(std::string_view table, std::int64_t ticket) noexcept;
  // Whether a release offered the place the lock since the last call (its
  // next try is then the lean confirm); the mark is cleared.
  bool take_offer(std::string_view table, std::int64_t ticket) noexcept;
  // The waiter's own queued try found it the runner-up of a head that may
  // let its offer lapse: the place looks at `probe_at` (its own NOTIFY of
  // an offer it made arms the same probe on the I/O thread).
  void watch_head(std::string_view table, std::int64_t ticket, Deadline probe_at) noexcept;

  // Election observers (issue 18; election_book.cpp): one LISTEN per
  // election on the session's connection; every NOTIFY's change is handed
  // to the box of each observer of that election, so observers make no
  // statement per change however many share the session. A box is one
  // observer's (a SessionBackend's), opened on its first wait.
  using ElectionBoxId = std::uint64_t;
  ElectionBoxId open_election_box();
  void close_election_box(ElectionBoxId id) noexcept;
  // As PostgresBackend::wait_for_election, for box `id`: a box not
  // listening yet (new, or its connection went) LISTENs on the I/O thread
  // and says resync; else it blocks until changes come, `timeout` passes or
  // `stop` fires. A connection that cannot LISTEN (a transaction pooler's)
  // waits a poll and says resync.
  Result<ElectionWake> wait_for_election(ElectionBoxId id, LockRef lock, std::chrono::nanoseconds timeout,
                                         std::stop_token stop);

  // Who leads (SessionBackend::leader): one reading, shared by every caller
  // for the same election and threshold that asked before it began. The
  // observers of an election, woken together at a leader's stale deadline,
  // cost the session a statement or two, not one each.
  Result<LeaderRecord> read_leader(LockRef lock, std::chrono::nanoseconds stale_threshold);

  [[nodiscard]] SessionStats stats() const noexcept;
  [[nodiscard]] const SessionOptions& options() const noexcept { return options_; }
  [[nodiscard]] const std::string& dsn() const noexcept { return dsn_; }
  [[nodiscard]] const std::string& redacted() const noexcept override { return redacted_; }
  [[nodiscard]] const std::vector<std::string>& secrets() const noexcept override { return secrets_; }
  [[nodiscard]] const PostgresOptions& postgres_options() const noexcept override { return options_.postgres; }
  [[nodiscard]] bool on_io_thread() const noexcept { return std::this_thread::get_id() == thread_id_.load(); }

 private:
  struct Job {
    const std::function<void(OwnSession&)>* body;
    bool running = false;
    bool done = false;
    std::condition_variable cv;
  };
  // A queue entry: a caller's Job, which it waits for, or a job the queue
  // owns (run_job), which nobody waits for.
  struct Queued {
    Job* waited = nullptr;
    std::function<void()> owned;
  };
  struct Watch {
    std::string table, lock_name, channel;  // channel empty: no LISTEN (unnamed statements)
    std::chrono::nanoseconds stale_threshold{0};
    std::optional<Deadline> check_at;  // the holder's row is read then
    std::uint64_t epoch = 0;           // the connection it LISTENs on
    std::function<void()> woken;
  };

  // A waiter's place in a lock's queue, as the I/O thread tells it.
  struct Place {
    std::string lock_name;
    std::string channel;  // empty: no LISTEN (unnamed statements): the waiter looks with backoff
    std::uint64_t epoch = 0;  // the connection it LISTENs on
    std::chrono::nanoseconds handoff{0};
    bool near = false;            // head or runner-up as far as it knows: it also looks at the holder's deadline
    bool lease_kept = false;      // alive by a lease its looks renew (a pooler in front), not by the connection
    bool holder_changed = false;  // an offer went to another waiter: the holder the last try met is gone
    std::optional<QueueWake> woke;     // turn or look, set by the I/O thread, taken by the waiter
    bool offered = false;  // a release named it (set by the I/O thread, taken by the try: take_offer)
    std::optional<Deadline> probe_at;  // the runner-up's look at a late head
    std::chrono::nanoseconds poll_delay{0};    // without LISTEN: the next look
    std::condition_variable* waiting = nullptr;  // the blocked waiter's, while it waits
    // An async waiter's, while it waits: its callback, and when the holder
    // goes stale as its last try saw it, or (without LISTEN) its next look.
    std::function<void(QueueWake)> async_woken;
    std::optional<Deadline> stale_at, look_at;
  };
  // The place of `ticket` in w's lock's queue; one this session did not
  // take (or forgot) is made, to look with backoff. mutex_ held.
  Place& place_of(const WatchRequest& w, std::int64_t ticket);
  // When an async waiter's timer is due (its probe, its stale deadline, its look), if it has one.
  static std::optional<Deadline> async_due(const Place& place);
  // Wakes, with look, the async waiters whose timer is due (the I/O thread).
  void wake_due_places(Deadline now);
  // Hands each place the offers and bare releases on its channel, and a
  // look to a place whose connection went (LISTENing again on the new one).
  void dispatch_to_places(const std::vector<Notification>& notes);

  // One observer's: the channel it LISTENs on (empty: not listening, or
  // its connection went: LISTEN again and read), the changes heard since
  // its last wait, its blocked wait's condition variable.
  struct ElectionBox {
    std::string channel;
    std::uint64_t epoch = 0;
    std::vector<ElectionNotice> notices;
    std::condition_variable* waiting = nullptr;
  };
  // A reading of who leads that callers wait for: joined until it begins.
  struct LeaderReading {
    std::optional<Result<LeaderRecord>> answer;
    std::condition_variable done;
  };
  using LeaderReadingKey = std::tuple<std::string, std::string, std::int64_t>;  // table, lock, threshold (ns)

  // Hands each box the changes on its channel, and marks deaf the boxes of
  // a connection that went (the I/O thread, after any I/O).
  void dispatch_to_election_boxes(const std::vector<Notification>& notes);

  void run() noexcept;
  // Copies the connection's counts to the stats (read by any thread).
  void note_counts() noexcept;
  void wake() noexcept;
  // After any I/O: dispatches notifications, wakes watches a reconnect or a
  // lost connection left deaf, counts statements.
  void after_io();
  void send_beats();
  // Each key's answer: nullopt if beaten, else why not.
  std::vector<std::optional<Error>> send(std::span<const HolderKey> keys, bool durable);
  // Reads each table with watches due (or all, at a re-check) once.
  void check_watches(bool all);
  [[nodiscard]] Deadline next_timer(Deadline now);
  // Takes the watches in `ids` out and runs their callbacks (no lock held).
  void wake_watches(const std::vector<WatchId>& ids);
  [[nodiscard]] std::chrono::nanoseconds recheck_every() const;
  [[nodiscard]] std::uint64_t epoch() const noexcept;

  std::string dsn_, redacted_;
  std::vector<std::string> secrets_;
  SessionOptions options_;
  OwnSession own_;  // the I/O thread's only
  std::optional<PostgresBackend> io_backend_;  // the operations, used by the I/O thread alone
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};  // set by the thread itself, first thing

  mutable std::mutex mutex_;  // guards what follows; never held across I/O or a callback
  bool stopping_ = false;
  std::deque<Queued> jobs_;
  std::vector<Beat> beats_;
  std::optional<Deadline> tick_end_;
  std::map<WatchId, Watch> watches_;
  std::map<std::pair<std::string, std::int64_t>, Place> places_;  // by table and ticket
  WatchId next_watch_ = 1;
  std::map<ElectionBoxId, ElectionBox> election_boxes_;
  std::map<LeaderReadingKey, std::shared_ptr<LeaderReading>> leader_readings_;  // not begun yet
  ElectionBoxId next_election_box_ = 1;
  Deadline next_recheck_ = Deadline::max();

  std::atomic<std::uint64_t> statements_{0}, heartbeat_statements_{0}, heartbeats_{0}, notifications_{0},
      rechecks_{0}, connects_{0};
};

}  // namespace pgmutex::postgres_detail
