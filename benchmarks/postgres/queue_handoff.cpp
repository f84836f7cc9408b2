// The queue of issue 17 through the library, against a real server: N waiters
// (N = 10 and 100), each a pgmutex::Mutex of its own (its own connection) on a
// thread of its own blocking in acquire(), or (N/S: 100/2, 1000/4) each a
// SessionMutex on one of S Sessions, and holders releasing in turn. A
// plain timed program printing its figures (Google Benchmark's iterations do
// not fit a line of N blocked threads):
//
//  - idle queue: a holder and N queued waiters, the server's statements/s
//    over 5 s (pg_stat_statements calls of the clients' role);
//  - handoffs: N + 1 threads take turns, so N always wait; each holder waits
//    until the previous holder has queued again (read by an observer role,
//    whose statements are not counted), then releases. Per release: the
//    statements of the clients' role (its rejoining try and enqueue
//    included; the per-statement breakdown is printed), the handoff latency
//    (release() returned -> the next acquire() returned), and FIFO: the
//    grant order against the order the waiters called acquire() (max
//    overtaking, 0 when first come, first served).
//
// It needs pg_stat_statements loaded and more connections than with-postgres
// allows: run it through benchmarks/postgres/queue_handoff.sh, which sets both.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
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

constexpr const char* observer_role = "queue_bench_observer";

// The observer reads the queue and the counters as a role of its own, so its
// reads stay out of the clients' pg_stat_statements figures.
class Observer {
 public:
  Observer(const std::string& table, const std::string& lock)
      : conn_("user=" + std::string(observer_role)), table_(table), lock_(lock) {
    pqxx::nontransaction tx(conn_);
    client_role_ = tx.exec("SELECT oid FROM pg_roles WHERE rolname = 'postgres'")[0][0].as<long long>();
  }

  // Waiters queued and not offered the lock.
  long waiting() {
    std::lock_guard lock(mutex_);
    ++reads_;
    pqxx::nontransaction tx(conn_);
    return tx.exec("SELECT count(*) FROM " + table_ + "_queue WHERE lock_name = " + tx.quote(lock_) +
                   " AND offered_fence IS NULL")[0][0].as<long>();
  }

  long reads() {
    std::lock_guard lock(mutex_);
    return reads_;
  }

  // Transactions committed in this database (pg_stat_database; backends
  // flush theirs when idle for 10 s, or at a commit 1 s after the last flush).
  long long transactions() {
    std::lock_guard lock(mutex_);
    ++reads_;
    pqxx::nontransaction tx(conn_);
    return tx.exec("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")[0][0]
        .as<long long>();
  }

  // Calls per statement of the clients' role in this database: query text -> calls.
  std::map<std::string, long long> calls() { return per_statement("calls"); }
  // The same statements' mean execution time in the server, in µs (since the server started).
  std::map<std::string, long long> mean_us() { return per_statement("round(mean_exec_time * 1000)::bigint"); }

 private:
  std::map<std::string, long long> per_statement(const std::string& column) {
    std::lock_guard lock(mutex_);
    ++reads_;
    pqxx::nontransaction tx(conn_);
    std::map<std::string, long long> out;
    const auto rows = tx.exec(
        "SELECT queryid::text || ' ' || left(q, 40) || ' … ' || right(q, 70), v FROM (SELECT queryid, "
        "regexp_replace(query, '\\s+', ' ', 'g') AS q, " + column + " AS v FROM pg_stat_statements "
        "WHERE userid = " + std::to_string(client_role_) +
        " AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())) s");
    for (const auto& row : rows) out[row[0].as<std::string>()] = row[1].as<long long>();
    return out;
  }

  std::mutex mutex_;
  long reads_ = 0;  // each read is a transaction of its own in this database
  pqxx::connection conn_;
  std::string table_, lock_;
  long long client_role_ = 0;
};

long long total(const std::map<std::string, long long>& calls) {
  long long sum = 0;
  for (const auto& [q, c] : calls) sum += c;
  return sum;
}

void print_breakdown(const std::map<std::string, long long>& before, const std::map<std::string, long long>& after,
                     double per, const char* unit, const std::map<std::string, long long>& mean_us = {}) {
  std::vector<std::pair<long long, std::string>> rows;
  for (const auto& [query, calls] : after) {
    const auto it = before.find(query);
    const long long delta = calls - (it == before.end() ? 0 : it->second);
    if (delta > 0) rows.emplace_back(delta, query);
  }
  std::sort(rows.rbegin(), rows.rend());
  for (const auto& [delta, query] : rows) {
    const auto mean = mean_us.find(query);
    std::printf("      %8.2f %s  %s", delta / per, unit, query.c_str());
    if (mean != mean_us.end()) std::printf("  [server mean %lld us]", mean->second);
    std::printf("\n");
  }
}

double percentile(std::vector<double> v, double fraction) {
  std::sort(v.begin(), v.end());
  const double position = fraction * static_cast<double>(v.size() - 1);
  const auto low = static_cast<std::size_t>(position);
  const auto high = std::min(low + 1, v.size() - 1);
  return v[low] + (v[high] - v[low]) * (position - static_cast<double>(low));
}

struct Grant {
  long ticket;  // arrival order: when the waiter called acquire()
  Clock::time_point at;
};

// sessions == 0: each waiter a pgmutex::Mutex on its own connection; else
// each a SessionMutex, waiter i on session i % sessions.
void run(int n, int releases, int sessions) {
  const std::string table = "bench_queue_" + std::to_string(n) + (sessions > 0 ? "_s" + std::to_string(sessions) : "");
  const std::string lock = "line";
  {
    pgmutex::Options o;
    o.table = table;
    o.lock_name = lock;
    pgmutex::Mutex(PostgresBackend(""), o).create_schema();
    pqxx::connection admin("");
    pqxx::nontransaction tx(admin);
    tx.exec("GRANT SELECT ON " + table + "_queue TO " + observer_role);
  }
  Observer observer(table, lock);

  std::mutex book;  // guards grants and released
  std::vector<Grant> grants;
  std::vector<Clock::time_point> released;  // released[k]: the holder of grants[k] returned from release()
  std::vector<double> release_call_us;       // how long each release() call took
  std::atomic<long> next_ticket{0};
  std::atomic<bool> go{false};
  std::atomic<int> done_releases{0};
  std::atomic<int> failures{0};
  std::stop_source stop;
  std::vector<std::shared_ptr<pgmutex::Session>> shared;
  for (int i = 0; i < sessions; ++i) shared.push_back(pgmutex::Session::create(""));

  const auto take_turns = [&](int id, auto& mutex) {
    while (!stop.stop_requested()) {
      const long ticket = next_ticket++;
      auto got = mutex.acquire(pgmutex::nothrow, std::nullopt, stop.get_token());
      const auto at = Clock::now();
      if (!got) {
        if (!stop.stop_requested()) {
          std::fprintf(stderr, "w%d: acquire failed: %s\n", id, got.error().message().c_str());
          ++failures;
        }
        return;
      }
      if (stop.stop_requested()) return;  // the guard releases
      std::size_t index;
      {
        std::lock_guard lk(book);
        index = grants.size();
        grants.push_back({ticket, at});
        released.emplace_back();
      }
      while (!go.load()) std::this_thread::sleep_for(1ms);
      if (done_releases.load() >= releases) {
        while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
        return;
      }
      // The previous holder has queued again: N wait behind this holder.
      const auto deadline = Clock::now() + 30s;
      while (observer.waiting() < n && Clock::now() < deadline && !stop.stop_requested())
        std::this_thread::sleep_for(200us);
      const auto before = Clock::now();
      auto result = got->release(pgmutex::nothrow);
      const auto after = Clock::now();
      if (!result) {
        std::fprintf(stderr, "w%d: release failed: %s\n", id, result.error().message().c_str());
        ++failures;
      }
      {
        std::lock_guard lk(book);
        released[index] = after;
        release_call_us.push_back(std::chrono::duration<double, std::micro>(after - before).count());
      }
      ++done_releases;
    }
  };
  const auto waiter = [&](int id) {
    pgmutex::Options o;
    o.table = table;
    o.lock_name = lock;
    o.instance_id = "w" + std::to_string(id);
    if (shared.empty()) {
      pgmutex::Mutex mutex(PostgresBackend(""), o);
      take_turns(id, mutex);
    } else {
      pgmutex::SessionMutex mutex(shared[static_cast<std::size_t>(id) % shared.size()]->backend(), o);
      take_turns(id, mutex);
    }
  };

  std::vector<std::thread> threads;
  threads.emplace_back(waiter, 0);
  while (true) {
    {
      std::lock_guard lk(book);
      if (!grants.empty()) break;
    }
    std::this_thread::sleep_for(1ms);
  }
  for (int i = 1; i <= n; ++i) {
    threads.emplace_back(waiter, i);
    const auto deadline = Clock::now() + 30s;
    while (observer.waiting() < i) {
      if (Clock::now() > deadline) throw std::runtime_error("waiter " + std::to_string(i) + " did not queue");
      std::this_thread::sleep_for(2ms);
    }
  }

  // Idle: the holder sleeps, N wait. The waiters' set-up transactions reach
  // pg_stat_database up to 10 s late: 12 s first, as session_bench (b) does.
  std::this_thread::sleep_for(12s);
  const auto idle0 = observer.calls();
  const long long tx0 = observer.transactions();
  const auto idle_start = Clock::now();
  std::this_thread::sleep_for(5s);
  const auto idle1 = observer.calls();
  const long long tx1 = observer.transactions();
  const double idle_s = std::chrono::duration<double>(Clock::now() - idle_start).count();

  // Handoffs.
  const auto run0 = observer.calls();
  const long long run_tx0 = observer.transactions();
  const long reads0 = observer.reads();  // run_tx0's read included
  const auto run_start = Clock::now();
  go = true;
  const auto deadline = Clock::now() + 600s;
  while (true) {
    {
      std::lock_guard lk(book);
      if (done_releases.load() >= releases && static_cast<int>(grants.size()) >= releases + 1) break;
    }
    if (Clock::now() > deadline || failures.load() > 0) break;
    std::this_thread::sleep_for(5ms);
  }
  std::this_thread::sleep_for(300ms);  // the last releaser has queued again
  const auto run1 = observer.calls();
  const auto run_mean_us = observer.mean_us();
  const double run_s = std::chrono::duration<double>(Clock::now() - run_start).count();
  // Every backend has flushed its counters 10 s after it went idle; the line is idle now.
  std::this_thread::sleep_for(11s);
  const long observer_reads = observer.reads() - reads0 + 1;  // run_tx0's own commit came after its reading
  const long long run_tx1 = observer.transactions();
  stop.request_stop();
  for (auto& t : threads) t.join();

  std::lock_guard lk(book);
  const int measured = std::min<int>(done_releases.load(), static_cast<int>(grants.size()) - 1);
  std::vector<double> latency_us;
  for (int k = 0; k < measured; ++k)
    latency_us.push_back(std::chrono::duration<double, std::micro>(grants[k + 1].at - released[k]).count());
  // Max overtaking: for each ticket, the later tickets granted before it
  // (a ticket never granted counts every later ticket granted).
  std::map<long, std::size_t> rank;
  for (std::size_t g = 0; g <= static_cast<std::size_t>(measured); ++g) rank[grants[g].ticket] = g;
  const long last_ticket = next_ticket.load();
  long max_overtaking = 0, overtaken_waiters = 0, out_of_order = 0;
  for (long t = 0; t < last_ticket; ++t) {
    const auto mine = rank.count(t) ? rank[t] : SIZE_MAX;
    long later_first = 0;
    for (const auto& [other, r] : rank)
      if (other > t && r < mine) ++later_first;
    max_overtaking = std::max(max_overtaking, later_first);
    overtaken_waiters += later_first > 0 && mine != SIZE_MAX ? 1 : 0;
  }
  for (int g = 1; g <= measured; ++g) out_of_order += grants[g].ticket < grants[g - 1].ticket ? 1 : 0;

  if (sessions == 0) std::printf("N = %d waiters (each a pgmutex::Mutex on its own connection and thread)\n", n);
  else
    std::printf("N = %d waiters (each a SessionMutex on a thread of its own, on %d Sessions: %d connections)\n", n,
                sessions, sessions);
  std::printf("  idle queue, %.1f s: %.2f statements/s from the clients' role (holder's heartbeat included)\n", idle_s,
              static_cast<double>(total(idle1) - total(idle0)) / idle_s);
  print_breakdown(idle0, idle1, idle_s, "/s");
  // The observer's own reads commit in this database too: those after tx0's, until tx1's, are taken off.
  std::printf("  idle queue: %.2f transactions/s committed in the database (the observer's 2 reads excluded)\n",
              static_cast<double>(tx1 - tx0 - 2) / idle_s);
  std::printf("  %d releases in %.1f s (%d failures)\n", measured, run_s, failures.load());
  std::printf("  statements per release: %.2f (the rejoining waiter's try and enqueue included)\n",
              static_cast<double>(total(run1) - total(run0)) / measured);
  print_breakdown(run0, run1, measured, "/release", run_mean_us);
  std::printf("  transactions committed in the database per release: %.2f (the observer's reads excluded; a "
              "LISTENing backend commits one to read each NOTIFY)\n",
              static_cast<double>(run_tx1 - run_tx0 - observer_reads) / measured);
  if (!latency_us.empty())
    std::printf("  handoff, release() returned -> next acquire() returned: median %.0f us, p90 %.0f us, max %.0f us\n",
                percentile(latency_us, 0.5), percentile(latency_us, 0.9),
                *std::max_element(latency_us.begin(), latency_us.end()));
  if (!release_call_us.empty())
    std::printf("  release() call itself (the release statement, its NOTIFY, the commit): median %.0f us, p90 %.0f us\n",
                percentile(release_call_us, 0.5), percentile(release_call_us, 0.9));
  std::printf("  FIFO: max overtaking %ld, waiters overtaken %ld, grants out of ticket order %ld (of %d)\n",
              max_overtaking, overtaken_waiters, out_of_order, measured);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    {
      pqxx::connection admin("");
      pqxx::nontransaction tx(admin);
      tx.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
      if (tx.exec("SELECT count(*) FROM pg_roles WHERE rolname = '" + std::string(observer_role) + "'")[0][0].as<long>() == 0)
        tx.exec("CREATE ROLE " + std::string(observer_role) + " LOGIN IN ROLE pg_read_all_stats");
    }
    const int releases = argc > 1 ? std::stoi(argv[1]) : 200;
    // The rest: the lines to run, "N" (N Mutex objects) or "N/S" (N
    // SessionMutex on S Sessions); by default 10, 100, 100/2 and 1000/4.
    std::vector<std::string> lines(argv + std::min(argc, 2), argv + argc);
    if (lines.empty()) lines = {"10", "100", "100/2", "1000/4"};
    for (const std::string& line : lines) {
      const auto slash = line.find('/');
      const int n = std::stoi(line.substr(0, slash));
      const int sessions = slash == std::string::npos ? 0 : std::stoi(line.substr(slash + 1));
      if (n < 1 || (slash != std::string::npos && sessions < 1))
        throw std::invalid_argument("a line is N or N/S, with N and S at least 1 (got '" + line + "')");
      run(n, releases, sessions);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "queue_handoff: %s\n", e.what());
    return 1;
  }
}
