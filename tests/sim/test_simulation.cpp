// Randomized simulation, FoundationDB/VOPR style: one root seed, a stream per
// component, virtual time, injected faults: failures, lost replies,
// partitions, statements that hang until released, server restarts that
// forget heartbeats committed asynchronously (whatever the WAL writer had not
// flushed yet: 0.6 s, 5 s or 30 s of them, beyond a heartbeat interval),
// whole clients paused (SIGSTOP: nothing of theirs runs, then everything runs
// late), timer threads that stall while the client goes on, clients whose
// clocks drift by up to ±5% and that each keep their own heartbeat interval,
// alert and stale thresholds and safety margin, 1 to 8 locks in 1 to 3
// tables. After every step the safety invariants are checked, per lock, for
// every client that is not paused (a paused one is checked at the moment it
// resumes, before any of its late timers has run):
//   - fences are granted in increasing order;
//   - at most one instance believes it holds the lock, and the row is its own;
//   - no instance believes it holds past its lease deadline (the row's age,
//     in true time, is below the believer's lease on its own clock);
//   - a fenced resource written by every believer never sees a lower fence
//     after a higher one.
// A third of the instances wait in line instead (acquire with a timeout, a
// spawned thread of the executor each: issue 17's queue), and may be killed
// (their connection closes for good), frozen (stopped and hung), cancelled
// (stop token) or left to time out. For the queue, after every step:
//   - FIFO: every grant from the queue goes to the first live waiter not
//     offered anything (the line as the server held it then);
//   - no barging: a plain try is granted only when no live waiter waits;
//   - a killed waiter is never granted anything after its death;
//   - fences of the grants the queue makes rise, as every grant's;
//   - a handoff deadline is honoured: an offer not confirmed by its
//     deadline is passed on within two polls when the first live waiter
//     behind it is responsive;
//   - a waiter that timed out or was cancelled, on a healthy connection,
//     leaves no place in the line;
//   - no starvation: a free lock is taken within a few polls while its
//     first live waiter is responsive (with FIFO and the handoff deadline,
//     every responsive waiter's turn comes).
// A failure prints the seed; replay one with
//   PGMUTEX_SIM_SEED=<seed> build/tests/sim/sim_tests
// PGMUTEX_SIM_SHARD=K/N runs the K-th of N slices of the seeds (CI runs the
// slices as parallel tests); PGMUTEX_SIM_SEEDS sets how many seeds in all.
#include "pgmutex/testing/simulation.hpp"
#include "pgmutex/testing/prng.hpp"
#include "sim_seeds.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

using namespace pgmutex;
using namespace pgmutex::testing;
using namespace std::chrono_literals;

namespace {

constexpr int instance_count = 8;
constexpr int steps_per_run = 300;
constexpr std::uint64_t default_seeds = 100000;

// Each run draws its layout: 1, 2, 4 or 8 locks spread over 1 to 3 tables
// (lock k in table k % tables); instance i contends for lock i % locks, so
// from eight instances on one lock down to one instance per lock.
struct LockSpot {
  std::string table;
  std::string name;
};
constexpr std::array<const char*, 3> table_names{"mutex_lock", "other_locks", "third_locks"};

std::vector<LockSpot> draw_spots(Prng& setup) {
  const std::size_t locks = std::size_t{1} << setup.below(4);
  const std::size_t tables = 1 + setup.below(table_names.size());
  std::vector<LockSpot> spots;
  for (std::size_t k = 0; k < locks; ++k) spots.push_back({table_names[k % tables], "lock" + std::to_string(k)});
  return spots;
}

// Instances 2 and 5 wait in line (a blocking acquire), the others try.
constexpr bool waits_in_line(int i) { return i % 3 == 2; }

struct Outcome {
  int grants = 0;
  int losses = 0;
  int restarts = 0;
  int pauses = 0;  // whole clients stopped, and timer threads stalled
  int queued_grants = 0;  // grants a waiter in line got
  int kills = 0;
  std::uint64_t provisional_grants = 0;  // confirms that committed asynchronously
  std::uint64_t confirms_taken_back = 0;  // of them, brought back to the offer by a restart
  std::string failure;  // empty: every invariant held
};

Outcome simulate(std::uint64_t seed) {
  Prng root(seed);
  Prng actions = root.fork("actions");
  Prng faults = root.fork("faults");
  Prng time = root.fork("time");
  Prng setup = root.fork("setup");

  Simulation sim;
  sim.server().record_queue_grants(true);
  const bool asynchronous = setup.chance(1, 2);
  static constexpr std::array<std::chrono::milliseconds, 3> flush_delays{600ms, 5s, 30s};
  if (asynchronous) sim.server().set_asynchronous_heartbeats(flush_delays[setup.below(flush_delays.size())]);
  // As PostgresBackend's defaults: confirms of offers commit asynchronously too (provisional grants).
  // Any time left will do: virtual time has no round trip to cover.
  if (asynchronous) sim.server().set_unflushed_confirms(1ms);

  const std::vector<LockSpot> spots = draw_spots(setup);
  std::vector<SimMutex> instances;
  std::vector<SimMutex::guard_type> guards(instance_count);
  std::vector<bool> partitioned(instance_count, false);
  std::vector<bool> hung(instance_count, false);
  std::vector<bool> paused(instance_count, false);   // the whole client is stopped
  std::vector<bool> stalled(instance_count, false);  // its timers are held back; it goes on
  std::vector<double> rate(instance_count);
  std::vector<double> lease_true_s(instance_count);  // the lease on the instance's clock, in true seconds at worst
  // Each client keeps its own thresholds (heartbeat interval, alert, stale,
  // safety margin): a rival with a shorter stale threshold must not take the
  // lock from a holder with a longer one before the holder gives up. The
  // margin (a quarter of stale, plus an interval) covers the ±5% drift besides
  // an attempt and, with asynchronous heartbeats, a forgotten interval.
  static constexpr std::array<std::chrono::seconds, 4> stale_choices{60s, 120s, 300s, 600s};
  static constexpr std::array<std::chrono::seconds, 3> interval_choices{5s, 10s, 15s};
  for (int i = 0; i < instance_count; ++i) {
    const auto stale = stale_choices[setup.below(stale_choices.size())];
    const auto interval = interval_choices[setup.below(interval_choices.size())];
    const auto alert = interval * static_cast<int>(setup.between(2, 3));
    rate[i] = 0.95 + static_cast<double>(setup.below(101)) / 1000.0;  // 0.950 .. 1.050
    const LockSpot spot = spots[static_cast<std::size_t>(i) % spots.size()];
    Options o{.lock_name = spot.name, .instance_id = "i" + std::to_string(i),
              .table = spot.table, .heartbeat_interval = interval,
              .alert_threshold = alert, .stale_threshold = stale,
              .poll_interval = waits_in_line(i) ? 2s : 500ms,
              .safety_margin = stale / 4 + interval};
    // Half the waiters of a run with asynchronous commits take their offers
    // for as long as a lease: the run's steps (seconds to minutes) outlast the
    // default 2 s, and an offer confirmed after its deadline is durable, so
    // only these make provisional grants that a restart can take back.
    if (asynchronous && setup.chance(1, 2)) o.handoff_deadline = stale - (stale / 4 + interval);
    instances.push_back(sim.instance(std::move(o), NoMetrics{}, rate[i]));
    lease_true_s[i] = std::chrono::duration<double>(instances.back().options().lease()).count() / rate[i];
  }
  // One instance per table creates it (instance k uses lock k's table).
  for (std::size_t k = 0; k < spots.size() && k < table_names.size(); ++k) instances[k].create_schema();

  Outcome out;
  // The waiters in line: whether one's acquire runs, what it returned, and
  // its faults meanwhile (a dequeue that failed may leave its place).
  std::vector<bool> waiting(instance_count, false), killed(instance_count, false),
      frozen(instance_count, false), faulted(instance_count, false);
  std::vector<std::stop_source> stops(instance_count);
  std::vector<std::optional<Result<SimMutex::guard_type>>> waited(instance_count);
  std::vector<std::pair<std::string, std::int64_t>> dead_tickets;  // places of killed waiters (lock, ticket)
  std::vector<std::int64_t> places_before(instance_count, 0);  // the last ticket in line when a wait began
  std::vector<ManualClock::time_point> responsive_since(instance_count);
  // When each lock was first seen free while a live waiter queued for it
  // (nullopt: it was not), and when the server last restarted (after which
  // a free lock waits out the failover grace).
  std::vector<std::optional<ManualClock::time_point>> free_with_waiter(spots.size());
  std::optional<ManualClock::time_point> last_restart;
  std::map<std::pair<std::string, std::string>, Fence> queue_fence;  // per lock: the last grant the queue saw
  std::vector<Fence> last_granted(spots.size(), 0);
  std::vector<Fence> resource(spots.size(), 0);  // the highest fence each protected resource accepted
  std::ostringstream why;

  // Holds back a client's timers (or lets them run again), noted in `held`.
  const auto toggle_hold = [&](std::vector<bool>& held, int who) {
    const std::string connection = "i" + std::to_string(who);
    held[who] = !held[who];
    if (held[who]) {
      sim.pause(connection);
      ++out.pauses;
    } else {
      sim.resume(connection);
    }
  };

  for (int step = 0; step < steps_per_run && out.failure.empty(); ++step) {
    bool action_to_advance = false;
    const int who = static_cast<int>(actions.below(instance_count));
    const std::size_t lock = static_cast<std::size_t>(who) % spots.size();
    const std::string connection = "i" + std::to_string(who);
    const std::uint64_t action = actions.below(14);
    if (killed[who]) continue;  // its process died
    if (paused[who] && action != 10) continue;  // a stopped process does nothing
    if (waiting[who] && action <= 2) continue;  // inside its acquire
    if (action == 12 && !waiting[who]) action_to_advance = true;
    if (action == 13 && !waiting[who] && !frozen[who]) action_to_advance = true;
    // Whatever slows this client down restarts its clock of responsiveness.
    if (!action_to_advance && (action == 3 || action == 5 || action == 10 || action == 11 || action == 13)) {
      responsive_since[who] = sim.now();
      faulted[who] = faulted[who] || waiting[who];
    }
    switch (action_to_advance ? 7 : action) {
      case 0:
      case 1:
        if (waits_in_line(who) && !guards[who]) {
          // A blocking acquire, in line, as a thread of its own.
          waiting[who] = true;
          // Its statements may fail, the dequeue too, or lose their replies
          // (an enqueue's: a place nobody waits in).
          faulted[who] = hung[who] || partitioned[who] || sim.server().faults_pending();
          places_before[who] = 0;  // a place left by an earlier wait whose dequeue failed is not this one's
          for (const auto& e : sim.server().peek_queue(LockRef{spots[lock].table, spots[lock].name}))
            places_before[who] = std::max(places_before[who], e.ticket);
          responsive_since[who] = sim.now();
          stops[who] = std::stop_source();
          const auto timeout = std::chrono::seconds(time.between(5, 120));
          sim.executor().spawn([&, who, lock, timeout, stop = stops[who].get_token()] {
            auto got = instances[who].acquire(nothrow, timeout, stop);
            if (got && *got) {
              ++out.grants;
              ++out.queued_grants;
              if (got->fence() <= last_granted[lock] && out.failure.empty()) {
                why << "i" << who << " granted fence " << got->fence() << " in line after " << last_granted[lock];
                out.failure = why.str();
              }
              last_granted[lock] = std::max(last_granted[lock], got->fence());
              guards[who] = std::move(*got);
            } else {
              waited[who] = std::move(got);
            }
            waiting[who] = false;
          });
          sim.executor().run_due();
        } else if (!guards[who]) {
          auto attempt = instances[who].try_acquire(nothrow);
          if (attempt && *attempt) {
            ++out.grants;
            if (attempt->fence() <= last_granted[lock]) {
              why << "step " << step << ": fence " << attempt->fence() << " granted after " << last_granted[lock];
              out.failure = why.str();
            }
            last_granted[lock] = attempt->fence();
            guards[who] = std::move(*attempt);
          }
        }
        break;
      case 2:
        if (guards[who].owns_lock()) (void)guards[who].release(nothrow);
        break;
      case 12:  // a waiter's process dies, or it is cancelled
        if (faults.chance(1, 2)) {
          for (const auto& e : sim.server().peek_queue(LockRef{spots[lock].table, spots[lock].name}))
            if (e.connection == connection) dead_tickets.emplace_back(spots[lock].name, e.ticket);
          sim.server().kill_connection(connection);
          killed[who] = true;
          ++out.kills;
        } else {
          stops[who].request_stop();
        }
        break;
      case 13:  // a waiter freezes (stopped, its statements hung), or thaws
        if (paused[who] || stalled[who] || hung[who] != frozen[who]) break;
        frozen[who] = !frozen[who];
        hung[who] = frozen[who];
        if (frozen[who]) {
          sim.server().hang(connection);
          toggle_hold(paused, who);
        } else {
          toggle_hold(paused, who);
          sim.server().unhang(connection);
        }
        break;
      case 3:
        if (partitioned[who]) sim.server().heal(connection);
        else sim.server().partition(connection);
        partitioned[who] = !partitioned[who];
        break;
      case 4:
        for (int i = 0; i < instance_count; ++i) faulted[i] = faulted[i] || waiting[i];
        if (faults.chance(1, 2)) sim.server().plan({MemoryServer::Fault::lose_reply});
        else sim.server().fail_next(static_cast<int>(faults.between(1, 3)));
        break;
      case 5:
        if (frozen[who]) break;
        if (hung[who]) sim.server().unhang(connection);
        else sim.server().hang(connection);
        hung[who] = !hung[who];
        break;
      case 6:
        if (faults.chance(1, 4)) {
          for (int i = 0; i < instance_count; ++i) faulted[i] = faulted[i] || waiting[i];
          sim.server().restart();
          last_restart = sim.now();
          ++out.restarts;
        }
        break;
      case 10:  // SIGSTOP / SIGCONT of the whole client; its late timers run
                // at the next advance, and it is checked before
        if (!stalled[who] && !frozen[who]) toggle_hold(paused, who);
        break;
      case 11:  // its timer thread stalls, or runs again
        if (!paused[who]) toggle_hold(stalled, who);
        break;
      default:
        sim.advance(std::chrono::seconds(time.between(1, 240)));
        break;
    }

    for (std::size_t l = 0; l < spots.size() && out.failure.empty(); ++l) {
      const LockRef ref{spots[l].table, spots[l].name};
      const auto row = sim.server().peek(ref);
      int believers = 0;
      for (int i = static_cast<int>(l); i < instance_count; i += static_cast<int>(spots.size())) {
        if (paused[i] || !guards[i]) continue;  // stopped; or empty, released or lost
        ++believers;
        const Fence fence = guards[i].fence();
        if (!row || row->fence != fence || row->instance_id != "i" + std::to_string(i)) {
          why << "step " << step << ": i" << i << " believes it holds " << ref.lock_name << " with fence " << fence
              << " but the row is " << (row ? row->instance_id + " fence " + std::to_string(row->fence) : "gone");
          out.failure = why.str();
        } else if (row->seconds_since_heartbeat >= lease_true_s[i]) {
          why << "step " << step << ": i" << i << " believes it holds " << ref.lock_name << ", but its row is "
              << row->seconds_since_heartbeat << " s old, past its lease of " << lease_true_s[i]
              << " s (true time, clock rate " << rate[i] << (asynchronous ? ", asynchronous heartbeats" : "") << ")";
          out.failure = why.str();
        }
        // The believer writes to the resource it protects, fenced.
        if (fence < resource[l]) {
          why << "step " << step << ": the resource behind " << ref.lock_name << " got fence " << fence
              << " after " << resource[l];
          out.failure = why.str();
        }
        resource[l] = std::max(resource[l], fence);
      }
      if (believers > 1) {
        why << "step " << step << ": " << believers << " instances believe they hold " << ref.lock_name;
        out.failure = why.str();
      }
      // The handoff deadline: an offer that lapsed is passed on within a few
      // polls by the first live waiter behind it, while that one responds.
      const auto line = sim.server().peek_queue(ref);
      const auto offer = std::ranges::find_if(line, [&](const MemoryServer::QueueEntry& e) {
        return row && e.offered_fence == row->fence && e.instance_id == row->instance_id;
      });
      const auto next = std::ranges::find_if(line, [](const MemoryServer::QueueEntry& e) {
        return e.offered_fence == 0 && e.alive;
      });
      // That waiter's instance, and whether it can act on its turn now: it
      // waits, with one place only, and nothing stops or cuts it off.
      const int next_i = next == line.end() ? -1 : std::stoi(next->instance_id.substr(1));
      const bool next_responsive =
          next_i >= 0 && waiting[next_i] &&
          std::ranges::count(line, next->connection, &MemoryServer::QueueEntry::connection) == 1 &&
          !paused[next_i] && !stalled[next_i] && !partitioned[next_i] && !hung[next_i];
      // How long it may take to act: a few polls, at the slowest clock rate drawn.
      const auto within_polls = [&](ManualClock::time_point since) {
        return sim.now() <= since + 5 * instances[next_i].options().poll_interval * 106 / 100;
      };
      // No starvation: a lock free for its first live waiter to take (no
      // row, or a row stale for both its holder and the waiter, not offered
      // to anyone) is taken within a few polls while that waiter responds
      // (past the failover grace of a restart: at most the longest stale
      // threshold drawn).
      std::optional<ManualClock::time_point> free_at;
      if (next_i >= 0) {
        const auto waiter_stale = instances[next_i].options().stale_threshold;
        const auto stale_for_both = std::chrono::duration<double>(std::max(row ? row->stale_threshold : 0s, waiter_stale));
        if (!row) {
          free_at = sim.now();
        } else if (offer == line.end() && row->seconds_since_heartbeat > stale_for_both.count()) {
          free_at = sim.now() - std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::duration<double>(row->seconds_since_heartbeat) - stale_for_both);
        }
      }
      if (!free_at) free_with_waiter[l].reset();
      else if (!free_with_waiter[l]) free_with_waiter[l] = free_at;
      if (free_with_waiter[l] && out.failure.empty()) {
        auto since = std::max(*free_with_waiter[l], responsive_since[next_i]);
        if (last_restart) since = std::max(since, *last_restart + stale_choices.back());
        if (next_responsive && !within_polls(since)) {
          why << "step " << step << ": " << ref.lock_name << " is free since "
              << free_with_waiter[l]->time_since_epoch().count() << " ns while " << next->instance_id
              << " waits first in line, responsive since " << responsive_since[next_i].time_since_epoch().count()
              << " ns, at " << sim.now().time_since_epoch().count() << " ns";
          out.failure = why.str();
        }
      }
      if (offer != line.end() && next != line.end() && out.failure.empty()) {
        const auto lapsed_at = ManualClock::time_point(offer->offered_until);
        const auto since = std::max(lapsed_at, responsive_since[next_i]);
        if (next_responsive && !within_polls(since)) {
          why << "step " << step << ": the offer of " << ref.lock_name << " to " << offer->instance_id
              << " lapsed at " << lapsed_at.time_since_epoch().count() << " ns and " << next->instance_id
              << ", responsive since " << responsive_since[next_i].time_since_epoch().count()
              << " ns, still waits at " << sim.now().time_since_epoch().count() << " ns";
          out.failure = why.str();
        }
      }
    }
    if (sim.server().faults_pending())
      for (int i = 0; i < instance_count; ++i) faulted[i] = faulted[i] || waiting[i];
    // Every grant the queue made or allowed since the last step.
    for (const auto& g : sim.server().take_queue_grants()) {
      if (!out.failure.empty()) break;
      if (g.ticket == 0 && !g.live_before.empty()) {
        why << "step " << step << ": a plain try took " << g.lock << " (fence " << g.fence << ") while "
            << g.live_before.size() << " live waiters queued";
        out.failure = why.str();
      } else if (g.ticket != 0 && (g.live_before.empty() || g.live_before.front() != g.ticket)) {
        why << "step " << step << ": " << g.lock << " went to ticket " << g.ticket << " out of line (first live: "
            << (g.live_before.empty() ? 0 : g.live_before.front()) << ")";
        out.failure = why.str();
      } else if (g.ticket != 0 && std::ranges::find(dead_tickets, std::pair{g.lock, g.ticket}) != dead_tickets.end()) {
        why << "step " << step << ": " << g.lock << " went to the killed waiter of ticket " << g.ticket;
        out.failure = why.str();
      }
      Fence& last = queue_fence[{g.table, g.lock}];
      if (g.fence <= last && out.failure.empty()) {
        why << "step " << step << ": the queue granted " << g.lock << " fence " << g.fence << " after " << last;
        out.failure = why.str();
      }
      last = g.fence;
    }
    // A waiter that gave up (timeout, cancellation) on a healthy connection leaves no place.
    for (int i = 0; i < instance_count && out.failure.empty(); ++i) {
      if (!waited[i]) continue;
      const std::size_t l = static_cast<std::size_t>(i) % spots.size();
      const std::string own = "i" + std::to_string(i);
      if (!faulted[i] && !killed[i])
        for (const auto& e : sim.server().peek_queue(LockRef{spots[l].table, spots[l].name}))
          if (e.connection == own && e.ticket > places_before[i]) {
            why << "step " << step << ": " << own << " gave up ("
                << (*waited[i] ? make_error_code((*waited[i])->why()).message() : waited[i]->error().message())
                << ") but left ticket " << e.ticket << " in line";
            out.failure = why.str();
          }
      waited[i].reset();
    }
  }
  // Every waiter returns (its timeout passes) before the world goes.
  for (int i = 0; i < instance_count; ++i) {
    const std::string connection = "i" + std::to_string(i);
    if (hung[i]) sim.server().unhang(connection);
    if (partitioned[i]) sim.server().heal(connection);
    if (paused[i] || stalled[i]) sim.resume(connection);
    paused[i] = stalled[i] = false;
  }
  for (int rounds = 0; sim.executor().running() > 0 && rounds < 100; ++rounds) sim.advance(60s);
  if (sim.executor().running() > 0 && out.failure.empty()) out.failure = "a waiter never returned from its acquire";
  // Held-back tasks hold their mutex's state: every client runs again, and
  // what is due runs, before the mutexes go.
  for (int i = 0; i < instance_count; ++i)
    if (paused[i] || stalled[i]) sim.resume("i" + std::to_string(i));
  sim.executor().run_due();
  for (auto& g : guards) out.losses += g.owns_lock() && g.lost();
  const auto unflushed = sim.server().unflushed_confirm_counts();
  out.provisional_grants = unflushed.made;
  out.confirms_taken_back = unflushed.taken_back;
  return out;
}

}  // namespace

TEST_CASE("random schedules of acquires, releases, partitions, hangs, restarts and faults keep every lock safe",
          "[sim]") {
  const std::vector<std::uint64_t> seeds = seeds_of_this_run(default_seeds);
  int grants = 0;
  int restarts = 0;
  int pauses = 0;
  std::uint64_t provisional = 0, taken_back = 0;
  for (const auto seed : seeds) {
    const Outcome out = simulate(seed);
    grants += out.grants;
    restarts += out.restarts;
    pauses += out.pauses;
    provisional += out.provisional_grants;
    taken_back += out.confirms_taken_back;
    if (!out.failure.empty()) {
      INFO("replay: PGMUTEX_SIM_SEED=" << seed << " build/tests/sim/sim_tests");
      REQUIRE(out.failure == "");
    }
  }
  // The schedules must actually exercise the locks, or the invariants prove nothing.
  CHECK(grants > static_cast<int>(seeds.size()));
  if (seeds.size() > 100) {
    CHECK(restarts > 0);
    CHECK(pauses > 0);
  }
  // Provisional grants: about 2 in 1,000 seeds, so only the long runs are
  // sure to meet some (a slice of 500 met none). A restart that takes one
  // back is rarer still (the first heartbeat, at once, makes it durable):
  // tests/unit/test_queue.cpp takes one back on purpose.
  if (seeds.size() >= 10000) {
    INFO("provisional grants " << provisional << ", confirms taken back " << taken_back);
    CHECK(provisional > 0);
  }
}

TEST_CASE("the same seed replays the same run", "[sim]") {
  const Outcome first = simulate(42);
  const Outcome second = simulate(42);
  CHECK(first.grants == second.grants);
  CHECK(first.losses == second.losses);
  CHECK(first.grants > 0);
}
