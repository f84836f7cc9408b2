// Leader election (issue 18) through the library, against a real server. A
// plain timed program printing its figures, as queue_handoff is (a line of
// blocked candidates and LISTENing observers does not fit Google
// Benchmark's iterations). Each candidate and each observer is a
// pgmutex::Election / pgmutex::Observer on a connection of its own and a
// thread of its own. Four measurements:
//
//  1. observer latency: a candidate campaigns on a free lock (value vK),
//     proclaims (pK), resigns, CHANGES times; an Observer on another thread
//     records when next() returns each change. elected: campaign() returned
//     -> next() returned the elected change; proclaimed: proclaim() returned
//     -> next() returned it. The candidate waits for the observer to report
//     each change before the next one (no backlog). Signed: a NOTIFY is
//     sent at the commit, so the observer may hear before the leader's
//     call returns.
//  2. handoff: two candidates take turns; the leader waits until the other
//     waits in line (read from <table>_queue), then resign()s. resign()
//     called -> the successor's campaign() returned (and resign() returned
//     -> it). The same with two pgmutex::Mutex (release() / acquire()),
//     rounds interleaved, so both see the same machine.
//  3. statements per change: OBSERVERS Observers (role election_bench_observer,
//     own connections) follow CYCLES terms (elected, proclaimed, vacated: 3
//     changes each); pg_stat_statements calls per change, by role:
//     the candidate's (postgres) and the observers'.
//
// Needs pg_stat_statements loaded: run it through benchmarks/election/bench_election.sh.
//  4. the same with SESSION_OBSERVERS SessionObservers on SESSIONS Sessions
//     (one LISTEN per Session, no connection per observer).
//   election_bench [CHANGES [HANDOFFS [OBSERVERS [CYCLES [SESSION_OBSERVERS [SESSIONS]]]]]]
//   (default 200 200 20 50 1000 10)
//   election_bench --handoffs HANDOFFS ROUNDS: measurement 2 alone, in ROUNDS
//   rounds (which side goes first alternates), with each round's ratio.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

#include "pgmutex/mutex.hpp"
#include "pgmutex/session.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using pgmutex::PostgresBackend;

namespace {

constexpr const char* reader_role = "election_bench_reader";
constexpr const char* observer_role = "election_bench_observer";

double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double percentile(std::vector<double> v, double fraction) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double position = fraction * static_cast<double>(v.size() - 1);
  const auto low = static_cast<std::size_t>(position);
  const auto high = std::min(low + 1, v.size() - 1);
  return v[low] + (v[high] - v[low]) * (position - static_cast<double>(low));
}

// Machine-readable lines for the script's table: "FIGURE name p50 p90 n".
void figure(const char* name, const std::vector<double>& v) {
  std::printf("FIGURE %s %.1f %.1f %zu\n", name, percentile(v, 0.5), percentile(v, 0.9), v.size());
  std::printf("  %-44s p50 %8.0f us  p90 %8.0f us  min %8.0f  max %8.0f  (n = %zu)\n", name, percentile(v, 0.5),
              percentile(v, 0.9), v.empty() ? 0 : *std::min_element(v.begin(), v.end()),
              v.empty() ? 0 : *std::max_element(v.begin(), v.end()), v.size());
}

pgmutex::Options options_for(const std::string& table, const std::string& lock, const std::string& id) {
  pgmutex::Options o;
  o.table = table;
  o.lock_name = lock;
  o.instance_id = id;
  return o;
}

// Reads as a role of its own, so its reads stay out of the counted roles' figures.
class Reader {
 public:
  Reader(std::string table, std::string lock) : conn_("user=" + std::string(reader_role)), table_(std::move(table)), lock_(std::move(lock)) {}
  long waiting() {
    std::lock_guard l(m_);
    pqxx::nontransaction tx(conn_);
    return tx.exec("SELECT count(*) FROM " + table_ + "_queue WHERE lock_name = " + tx.quote(lock_) +
                   " AND offered_fence IS NULL")[0][0].as<long>();
  }
  // query -> calls, for one role.
  std::map<std::string, long long> calls(const std::string& role) {
    std::lock_guard l(m_);
    pqxx::nontransaction tx(conn_);
    std::map<std::string, long long> out;
    const auto rows = tx.exec(
        "SELECT queryid::text || ' ' || left(q, 40) || ' … ' || right(q, 60), calls FROM (SELECT queryid, "
        "regexp_replace(query, '\\s+', ' ', 'g') AS q, calls FROM pg_stat_statements "
        "WHERE userid = (SELECT oid FROM pg_roles WHERE rolname = " + tx.quote(role) + ") "
        "AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())) s");
    for (const auto& row : rows) out[row[0].as<std::string>()] = row[1].as<long long>();
    return out;
  }

 private:
  std::mutex m_;
  pqxx::connection conn_;
  std::string table_, lock_;
};

long long total(const std::map<std::string, long long>& c) {
  long long s = 0;
  for (const auto& [q, n] : c) s += n;
  return s;
}

void breakdown(const std::map<std::string, long long>& before, const std::map<std::string, long long>& after,
               double per) {
  std::vector<std::pair<long long, std::string>> rows;
  for (const auto& [q, n] : after) {
    const auto it = before.find(q);
    const long long d = n - (it == before.end() ? 0 : it->second);
    if (d > 0) rows.emplace_back(d, q);
  }
  std::sort(rows.rbegin(), rows.rend());
  for (const auto& [d, q] : rows) std::printf("      %8.3f /change  %s\n", static_cast<double>(d) / per, q.c_str());
}

// What an observer thread heard: (event, value, when).
struct Heard {
  pgmutex::LeaderEvent event;
  std::string value;
  Clock::time_point at;
  bool gap;
};

class Log {
 public:
  void add(Heard h) {
    {
      std::lock_guard l(m_);
      heard_.push_back(std::move(h));
    }
    cv_.notify_all();
  }
  // Waits until an entry with this event and value is heard; its time.
  // Only entries from index `from` on count.
  std::optional<Clock::time_point> wait_for(pgmutex::LeaderEvent e, const std::string& value,
                                            Clock::duration timeout = 5s, std::size_t from = 0) {
    std::unique_lock l(m_);
    std::optional<Clock::time_point> at;
    cv_.wait_for(l, timeout, [&] {
      for (std::size_t i = from; i < heard_.size(); ++i)
        if (heard_[i].event == e && heard_[i].value == value) {
          at = heard_[i].at;
          return true;
        }
      return false;
    });
    return at;
  }
  std::size_t size() {
    std::lock_guard l(m_);
    return heard_.size();
  }
  std::size_t gaps() {
    std::lock_guard l(m_);
    return static_cast<std::size_t>(std::count_if(heard_.begin(), heard_.end(), [](const Heard& h) { return h.gap; }));
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<Heard> heard_;
};

template <class Observer>
void observe_into(Observer& observer, Log& log, std::stop_token stop, std::atomic<long>* changes = nullptr) {
  while (!stop.stop_requested()) {
    auto c = observer.next(pgmutex::nothrow, 1s, stop);
    const auto at = Clock::now();
    if (!c) {
      std::fprintf(stderr, "observer: %s\n", c.error().message().c_str());
      std::this_thread::sleep_for(100ms);
      continue;
    }
    if (!*c) continue;
    const auto& change = **c;
    if (changes != nullptr) ++*changes;
    log.add({change.event, change.leader ? change.leader->value : std::string(), at, change.gap});
  }
}

// 1. Observer latency.
void observer_latency(const std::string& table, int changes) {
  const std::string lock = "observed";
  pgmutex::Election candidate(PostgresBackend(""), options_for(table, lock, "candidate"));
  pgmutex::Observer observer(PostgresBackend(""), options_for(table, lock, "observer"));
  Log log;
  std::jthread watching([&](std::stop_token stop) { observe_into(observer, log, stop); });
  if (!log.wait_for(pgmutex::LeaderEvent::current, "", 10s)) throw std::runtime_error("the observer did not start");

  std::vector<double> elected_us, proclaimed_us, proclaimed_from_call_us, vacated_us, campaign_call_us, proclaim_call_us;
  int missing = 0;
  for (int k = 0; k < changes; ++k) {
    const std::string v = "v" + std::to_string(k), p = "p" + std::to_string(k);
    const auto c0 = Clock::now();
    auto leadership = candidate.campaign(v, 10s);
    const auto c1 = Clock::now();
    if (!leadership) throw std::runtime_error("campaign on a free lock timed out");
    campaign_call_us.push_back(us(c1 - c0));
    if (auto at = log.wait_for(pgmutex::LeaderEvent::elected, v)) elected_us.push_back(us(*at - c1));
    else ++missing;
    const auto p0 = Clock::now();
    leadership.proclaim(p);
    const auto p1 = Clock::now();
    proclaim_call_us.push_back(us(p1 - p0));
    if (auto at = log.wait_for(pgmutex::LeaderEvent::proclaimed, p)) {
      proclaimed_us.push_back(us(*at - p1));
      proclaimed_from_call_us.push_back(us(*at - p0));
    } else {
      ++missing;
    }
    const std::size_t from = log.size();
    leadership.resign();
    const auto r1 = Clock::now();
    if (auto at = log.wait_for(pgmutex::LeaderEvent::vacated, "", 5s, from)) vacated_us.push_back(us(*at - r1));
    else ++missing;
  }
  watching.request_stop();
  watching.join();
  std::printf("1. observer latency: %d terms, 1 Observer (own connection, LISTEN), changes missed %d, gaps %zu\n",
              changes, missing, log.gaps());
  figure("observer_elected_us", elected_us);
  figure("observer_proclaimed_us", proclaimed_us);
  figure("observer_proclaimed_from_call_us", proclaimed_from_call_us);
  figure("observer_vacated_us", vacated_us);
  figure("campaign_call_free_lock_us", campaign_call_us);
  figure("proclaim_call_us", proclaim_call_us);
}

// 2. Handoff: two parties take turns; `take` blocks until it holds, `give` hands over.
struct Turns {
  std::vector<Clock::time_point> granted;      // granted[k]: the k-th holder's take returned
  std::vector<Clock::time_point> give_called;  // give_called[k]: the k-th holder called give
  std::vector<Clock::time_point> give_returned;
};

template <class Party>
Turns take_turns(const std::string& table, const std::string& lock, int handoffs,
                 std::function<std::unique_ptr<Party>(int)> make) {
  Reader reader(table, lock);
  std::mutex m;
  Turns t;
  std::atomic<int> given{0};
  std::atomic<int> failures{0};
  std::stop_source stop;
  const auto party = [&](int id) {
    auto p = make(id);
    while (!stop.stop_requested()) {
      if (!p->take(stop.get_token())) return;
      const auto at = Clock::now();
      std::size_t index;
      {
        std::lock_guard l(m);
        index = t.granted.size();
        t.granted.push_back(at);
        t.give_called.emplace_back();
        t.give_returned.emplace_back();
      }
      if (given.load() >= handoffs) {
        while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
        return;
      }
      const auto deadline = Clock::now() + 10s;
      while (reader.waiting() < 1 && Clock::now() < deadline) std::this_thread::sleep_for(200us);
      std::this_thread::sleep_for(1ms);  // the other is blocked in its wait, not between statements
      const auto g0 = Clock::now();
      if (!p->give()) ++failures;
      const auto g1 = Clock::now();
      {
        std::lock_guard l(m);
        t.give_called[index] = g0;
        t.give_returned[index] = g1;
      }
      ++given;
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(party, 0);
  while (true) {
    {
      std::lock_guard l(m);
      if (!t.granted.empty()) break;
    }
    std::this_thread::sleep_for(1ms);
  }
  threads.emplace_back(party, 1);
  const auto deadline = Clock::now() + 300s;
  while (Clock::now() < deadline && failures.load() == 0) {
    {
      std::lock_guard l(m);
      if (static_cast<int>(t.granted.size()) >= handoffs + 1) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  stop.request_stop();
  for (auto& th : threads) th.join();
  if (failures.load() > 0) throw std::runtime_error("a handoff failed");
  return t;
}

struct ElectionParty {
  pgmutex::Election election;
  std::optional<pgmutex::Election::leadership_type> leadership;
  int k = 0;
  ElectionParty(const std::string& table, const std::string& lock, int id)
      : election(PostgresBackend(""), options_for(table, lock, "c" + std::to_string(id))) {}
  bool take(std::stop_token stop) {
    auto got = election.campaign(pgmutex::nothrow, "leader-" + std::to_string(k++), std::nullopt, stop);
    if (!got || !*got) return false;
    leadership.emplace(std::move(*got));
    return true;
  }
  // The resigned handle goes here, on the resigning side, as MutexParty's
  // guard does: destroyed in take() it was timed as the successor's.
  bool give() {
    const bool resigned = static_cast<bool>(leadership->resign(pgmutex::nothrow));
    leadership.reset();
    return resigned;
  }
};

struct MutexParty {
  pgmutex::Mutex mutex;
  std::optional<pgmutex::Mutex::guard_type> guard;
  MutexParty(const std::string& table, const std::string& lock, int id)
      : mutex(PostgresBackend(""), options_for(table, lock, "m" + std::to_string(id))) {}
  bool take(std::stop_token stop) {
    auto got = mutex.acquire(pgmutex::nothrow, std::nullopt, stop);
    if (!got || !*got) return false;
    guard.emplace(std::move(*got));
    return true;
  }
  bool give() {
    auto r = guard->release(pgmutex::nothrow);
    guard.reset();
    return static_cast<bool>(r);
  }
};

void collect(const Turns& t, std::vector<double>& from_call, std::vector<double>& from_return, std::vector<double>& call) {
  for (std::size_t k = 0; k + 1 < t.granted.size(); ++k) {
    if (t.give_called[k] == Clock::time_point{}) continue;
    from_call.push_back(us(t.granted[k + 1] - t.give_called[k]));
    from_return.push_back(us(t.granted[k + 1] - t.give_returned[k]));
    call.push_back(us(t.give_returned[k] - t.give_called[k]));
  }
}

void handoffs(const std::string& table, int handoffs, int rounds) {
  std::vector<double> e_call, e_return, e_dur, m_call, m_return, m_dur;
  std::vector<double> round_ratios;  // each round's election p50 / mutex p50, from the call
  for (int r = 0; r < rounds; ++r) {
    const std::string lock = "handoff" + std::to_string(r);
    const std::size_t m_before = m_call.size(), e_before = e_call.size();
    // Which runs first alternates, so neither always follows the other.
    const auto mutex_round = [&] {
      const auto mt = take_turns<MutexParty>(table, lock + "m", handoffs / rounds,
                                             [&](int id) { return std::make_unique<MutexParty>(table, lock + "m", id); });
      collect(mt, m_call, m_return, m_dur);
    };
    const auto election_round = [&] {
      const auto et = take_turns<ElectionParty>(
          table, lock + "e", handoffs / rounds, [&](int id) { return std::make_unique<ElectionParty>(table, lock + "e", id); });
      collect(et, e_call, e_return, e_dur);
    };
    if (r % 2 == 0) {
      mutex_round();
      election_round();
    } else {
      election_round();
      mutex_round();
    }
    const std::vector<double> m(m_call.begin() + static_cast<std::ptrdiff_t>(m_before), m_call.end());
    const std::vector<double> e(e_call.begin() + static_cast<std::ptrdiff_t>(e_before), e_call.end());
    round_ratios.push_back(percentile(e, 0.5) / percentile(m, 0.5));
  }
  std::printf("2. handoff, 2 parties on own connections taking turns, %d rounds interleaved (mutex, election)\n", rounds);
  std::printf("  rounds where resign -> successor p50 <= the mutex's handoff p50: %d of %d;"
              " median of the rounds' ratios %.3f (min %.3f, max %.3f)\n",
              static_cast<int>(std::count_if(round_ratios.begin(), round_ratios.end(), [](double x) { return x <= 1.0; })),
              rounds, percentile(round_ratios, 0.5), *std::min_element(round_ratios.begin(), round_ratios.end()),
              *std::max_element(round_ratios.begin(), round_ratios.end()));
  figure("resign_called_to_successor_us", e_call);
  figure("resign_returned_to_successor_us", e_return);
  figure("resign_call_us", e_dur);
  figure("release_called_to_next_acquire_us", m_call);
  figure("release_returned_to_next_acquire_us", m_return);
  figure("release_call_us", m_dur);
}

// What measurements 3 and 4 share: the observers, each on a thread of its
// own, follow `cycles` terms of a candidate on a connection of its own
// (elected, proclaimed, vacated); pg_stat_statements' calls by the
// candidate's role and the observers' are read before and after.
using Calls = std::map<std::string, long long>;
struct Followed {
  Calls c0, c1, o0, o1;
  long reports = 0;
  std::size_t gaps = 0;
  int missing = 0;  // waits for a change that timed out
};

template <class Obs>
Followed follow_terms(const std::string& table, const std::string& lock, std::vector<std::unique_ptr<Obs>>& obs,
                      int cycles, std::chrono::seconds start_within, std::chrono::seconds vacated_within) {
  const std::size_t n = obs.size();
  Reader reader(table, lock);
  std::vector<std::unique_ptr<Log>> logs;
  for (std::size_t i = 0; i < n; ++i) logs.push_back(std::make_unique<Log>());
  std::vector<std::atomic<long>> heard(n);
  std::vector<std::jthread> threads;
  for (std::size_t i = 0; i < n; ++i)
    threads.emplace_back([&, i](std::stop_token stop) { observe_into(*obs[i], *logs[i], stop, &heard[i]); });
  for (auto& log : logs)
    if (!log->wait_for(pgmutex::LeaderEvent::current, "", start_within))
      throw std::runtime_error("an observer did not start");
  pgmutex::Election candidate(PostgresBackend(""), options_for(table, lock, "candidate"));
  {  // the candidate's connection and prepared statements: before the count
    auto l = candidate.campaign("warm-up", 10s);
    l.resign();
    for (auto& log : logs) log->wait_for(pgmutex::LeaderEvent::vacated, "");
  }
  std::this_thread::sleep_for(200ms);
  Followed f;
  f.c0 = reader.calls("postgres");
  f.o0 = reader.calls(observer_role);
  std::vector<long> heard0;
  for (auto& h : heard) heard0.push_back(h.load());
  for (int k = 0; k < cycles; ++k) {
    const std::string v = "v" + std::to_string(k), p = "p" + std::to_string(k);
    auto l = candidate.campaign(v, 10s);
    for (auto& log : logs) f.missing += log->wait_for(pgmutex::LeaderEvent::elected, v) ? 0 : 1;
    l.proclaim(p);
    for (auto& log : logs) f.missing += log->wait_for(pgmutex::LeaderEvent::proclaimed, p) ? 0 : 1;
    l.resign();
    // vacated carries no value: wait until each has heard 3 more changes.
    const auto deadline = Clock::now() + vacated_within;
    for (std::size_t i = 0; i < n; ++i)
      while (heard[i].load() < heard0[i] + 3L * (k + 1) && Clock::now() < deadline) std::this_thread::sleep_for(200us);
  }
  std::this_thread::sleep_for(200ms);
  f.c1 = reader.calls("postgres");
  f.o1 = reader.calls(observer_role);
  for (std::size_t i = 0; i < n; ++i) {
    f.reports += heard[i].load() - heard0[i];
    f.gaps += logs[i]->gaps();
  }
  for (auto& t : threads) t.request_stop();
  return f;
}

// 3. Statements per change with N observers on own connections.
void statements(const std::string& table, int observers, int cycles) {
  std::vector<std::unique_ptr<pgmutex::Observer>> obs;
  for (int i = 0; i < observers; ++i)
    obs.push_back(std::make_unique<pgmutex::Observer>(PostgresBackend("user=" + std::string(observer_role)),
                                                      options_for(table, "counted", "o" + std::to_string(i))));
  const Followed f = follow_terms(table, "counted", obs, cycles, 20s, 5s);
  const double changes = 3.0 * cycles;
  std::printf("3. statements per change: %d Observers on own connections (role %s), %d terms = %.0f changes "
              "(elected, proclaimed, vacated); reports heard %ld of %.0f, missed waits %d, gaps %zu\n",
              observers, observer_role, cycles, changes, f.reports, changes * observers, f.missing, f.gaps);
  std::printf("FIGURE statements_per_change_candidate %.3f %.3f %.0f\n", (total(f.c1) - total(f.c0)) / changes, 0.0,
              changes);
  std::printf("FIGURE statements_per_change_observers %.3f %.3f %d\n", (total(f.o1) - total(f.o0)) / changes, 0.0,
              observers);
  std::printf("  candidate (role postgres): %.3f statements per change (campaign's acquire that announces, proclaim, "
              "resign's release that vacates, heartbeats)\n", (total(f.c1) - total(f.c0)) / changes);
  breakdown(f.c0, f.c1, changes);
  std::printf("  all %d observers together: %.3f statements per change\n", observers,
              (total(f.o1) - total(f.o0)) / changes);
  breakdown(f.o0, f.o1, changes);
}

// 4. Statements per change with OBSERVERS SessionObservers spread over
// SESSIONS Sessions (role election_bench_observer): one LISTEN per Session,
// each NOTIFY handed by the Session's I/O thread to its observers.
void session_statements(const std::string& table, int sessions, int observers, int cycles) {
  std::vector<std::shared_ptr<pgmutex::Session>> pool;
  for (int k = 0; k < sessions; ++k) pool.push_back(pgmutex::Session::create("user=" + std::string(observer_role)));
  std::vector<std::unique_ptr<pgmutex::SessionObserver>> obs;
  for (int i = 0; i < observers; ++i)
    obs.push_back(std::make_unique<pgmutex::SessionObserver>(pool[static_cast<std::size_t>(i % sessions)]->backend(),
                                                             options_for(table, "counted_sessions", "s" + std::to_string(i))));
  const Followed f = follow_terms(table, "counted_sessions", obs, cycles, 60s, 10s);
  std::uint64_t notifications = 0;
  for (auto& session : pool) notifications += session->stats().notifications;
  const double changes = 3.0 * cycles;
  std::printf("4. statements per change: %d SessionObservers on %d Sessions (role %s), %d terms = %.0f changes; "
              "reports heard %ld of %.0f, missed waits %d, gaps %zu, NOTIFYs dispatched %llu\n",
              observers, sessions, observer_role, cycles, changes, f.reports, changes * observers, f.missing, f.gaps,
              static_cast<unsigned long long>(notifications));
  std::printf("FIGURE statements_per_change_session_observers %.3f %.3f %d\n", (total(f.o1) - total(f.o0)) / changes,
              0.0, observers);
  std::printf("  all %d observers together: %.3f statements per change\n", observers,
              (total(f.o1) - total(f.o0)) / changes);
  breakdown(f.o0, f.o1, changes);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    // election_bench --handoffs HANDOFFS ROUNDS: measurement 2 alone.
    const bool handoffs_only = argc > 1 && std::string(argv[1]) == "--handoffs";
    if (handoffs_only) {
      argv += 1;
      argc -= 1;
    }
    const int rounds = handoffs_only && argc > 2 ? std::stoi(argv[2]) : 4;
    const int changes = argc > 1 && !handoffs_only ? std::stoi(argv[1]) : 200;
    const int handoff_count = handoffs_only ? (argc > 1 ? std::stoi(argv[1]) : 200) : (argc > 2 ? std::stoi(argv[2]) : 200);
    const int observers = argc > 3 ? std::stoi(argv[3]) : 20;
    const int cycles = argc > 4 ? std::stoi(argv[4]) : 50;
    const int session_observers = argc > 5 ? std::stoi(argv[5]) : 1000;
    const int sessions = argc > 6 ? std::stoi(argv[6]) : 10;
    const std::string table = "bench_election";
    {
      pqxx::connection admin("");
      pqxx::nontransaction tx(admin);
      tx.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
      for (const auto& [role, rights] : {std::pair<std::string, std::string>{reader_role, "IN ROLE pg_read_all_stats"},
                                         std::pair<std::string, std::string>{observer_role, "SUPERUSER"}})
        if (tx.exec("SELECT count(*) FROM pg_roles WHERE rolname = " + tx.quote(role))[0][0].as<long>() == 0)
          tx.exec("CREATE ROLE " + role + " LOGIN " + rights);
    }
    pgmutex::Election(PostgresBackend(""), options_for(table, "schema", "schema")).create_schema();
    {
      pqxx::connection admin("");
      pqxx::nontransaction tx(admin);
      tx.exec("GRANT SELECT ON " + table + "_queue TO " + reader_role);
    }
    if (handoffs_only) {  // measurement 2 alone, in ROUNDS rounds
      handoffs(table, handoff_count, rounds);
      return 0;
    }
    observer_latency(table, changes);
    std::fflush(stdout);
    handoffs(table, handoff_count, rounds);
    std::fflush(stdout);
    statements(table, observers, cycles);
    std::fflush(stdout);
    session_statements(table, sessions, session_observers, cycles);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "election_bench: %s\n", e.what());
    return 1;
  }
}
