// One worker process of the load test (tests/load/run_load.py drives 16 of them).
//
//   load_worker schema                         create the lock table (once, before the workers start)
//   load_worker run WORKER LOCKS HOLDS         hold each of LOCKS locks HOLDS times
//
// A hold: acquire the lock through pgmutex::Mutex, write the hold's start to
// the fenced resource (load_holds, whose trigger rejects a fence lower than
// the highest it accepted for that lock), wait a moment, write its end, release.
// A hold whose lease is lost, or whose write the trigger rejects, is abandoned
// (recorded in load_events) and done again; the worker never writes after it
// knows the lease is lost. The driver SIGKILLs workers and restarts them: a
// restarted worker resumes after its last completed hold of each lock, read
// back from load_holds, so every hold completes exactly once. Its connections
// are terminated by pg_terminate_backend storms: a write whose outcome is
// unknown is resolved by reading the row back.
//
// Connection info comes from the PG* environment; every connection is named
// application_name=pgmutex_load, which is how the driver finds them to terminate.
#include <unistd.h>

#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "pgmutex/mutex.hpp"

using namespace std::chrono_literals;

namespace {

constexpr const char* dsn = "application_name=pgmutex_load";

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Counts the takeovers of a stale lock (a SIGKILLed holder's) that this process made.
std::atomic<int> reclaims{0};

struct ReclaimCounter {
  void stale_reclaimed(std::string_view, std::string_view, std::string_view) { reclaims.fetch_add(1); }
};

using LoadMutex = pgmutex::BasicMutex<pgmutex::PostgresBackend, pgmutex::SteadyClock, ReclaimCounter>;

pgmutex::Options load_options(const std::string& lock, const std::string& instance) {
  pgmutex::Options o;
  o.lock_name = lock;
  o.instance_id = instance;
  // Short enough that a SIGKILLed holder's lock is reclaimed within seconds.
  o.heartbeat_interval = 250ms;
  o.alert_threshold = 1500ms;
  o.stale_threshold = 3s;
  o.safety_margin = 1s;
  o.poll_interval = 20ms;  // NOTIFY wakes waiters sooner; this bounds a missed one
  return o;
}

// The resource: a libpq connection of its own, re-opened after a termination.
class Resource {
 public:
  ~Resource() { close(); }

  // Runs `sql`; the number of rows it affected, or -1 if the connection failed
  // (then the outcome is unknown and the connection is re-opened next time).
  int run(const char* sql, const std::vector<std::string>& params) {
    if (!connect()) return -1;
    std::vector<const char*> values;
    for (const std::string& p : params) values.push_back(p.c_str());
    PGresult* result = PQexecParams(conn_, sql, static_cast<int>(values.size()), nullptr, values.data(), nullptr,
                                    nullptr, 0);
    const ExecStatusType status = PQresultStatus(result);
    int rows = -1;
    if (status == PGRES_COMMAND_OK) rows = std::atoi(PQcmdTuples(result));
    else if (status == PGRES_TUPLES_OK) rows = PQntuples(result);
    else std::fprintf(stderr, "load_worker: %s", PQresultErrorMessage(result));
    PQclear(result);
    if (rows < 0) close();
    return rows;
  }

  // A query's single value, or nullopt on failure (NULL reads as "").
  std::optional<std::string> value(const char* sql, const std::vector<std::string>& params) {
    if (!connect()) return std::nullopt;
    std::vector<const char*> values;
    for (const std::string& p : params) values.push_back(p.c_str());
    PGresult* result = PQexecParams(conn_, sql, static_cast<int>(values.size()), nullptr, values.data(), nullptr,
                                    nullptr, 0);
    std::optional<std::string> out;
    if (PQresultStatus(result) == PGRES_TUPLES_OK)
      out = PQntuples(result) > 0 ? std::string(PQgetvalue(result, 0, 0)) : std::string();
    else
      std::fprintf(stderr, "load_worker: %s", PQresultErrorMessage(result));
    PQclear(result);
    if (!out) close();
    return out;
  }

 private:
  bool connect() {
    if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK) return true;
    close();
    conn_ = PQconnectdb(dsn);
    if (PQstatus(conn_) != CONNECTION_OK) {
      close();
      std::this_thread::sleep_for(20ms);
      return false;
    }
    // No server restart in this test, so a commit need not wait for the WAL flush.
    PQclear(PQexec(conn_, "SET synchronous_commit = off"));
    return true;
  }
  void close() {
    if (conn_ != nullptr) PQfinish(conn_);
    conn_ = nullptr;
  }
  PGconn* conn_ = nullptr;
};

struct Tally {
  int holds = 0;
  int lost = 0;
  int rejected = 0;
  int acquire_errors = 0;
  int write_retries = 0;
  int release_errors = 0;
};

enum class Write { accepted, rejected, lost };

// Writes through the fence trigger until the outcome is known; gives up (lost)
// as soon as the lease is lost. `check` reads back whether the write landed:
// its parameters are the first four of the write's (the hold's key).
Write fenced_write(Resource& resource, const LoadMutex::guard_type& guard, const char* sql,
                   const std::vector<std::string>& params, const char* check, Tally& tally) {
  const std::vector<std::string> key(params.begin(), params.begin() + 4);
  for (;;) {
    if (guard.lost() || !guard.owns_lock()) return Write::lost;
    const int rows = resource.run(sql, params);
    if (rows == 1) return Write::accepted;
    if (rows == 0) return Write::rejected;
    ++tally.write_retries;
    // Unknown outcome: did it land before the connection died?
    if (tally.write_retries % 1000 == 0) throw std::runtime_error("1,000 failed writes: is the server gone?");
    for (;;) {
      const auto landed = resource.value(check, key);
      if (landed) {
        if (*landed == "t") return Write::accepted;
        break;  // it did not: write again (if the lease still holds)
      }
      if (guard.lost()) return Write::lost;
    }
  }
}

void record_event(Resource& resource, int worker, const std::string& kind, const std::string& lock,
                  pgmutex::Fence fence) {
  for (int attempt = 0; attempt < 50; ++attempt)
    if (resource.run("INSERT INTO load_events(worker, pid, kind, lock_name, fence, at_ns) VALUES ($1, $2, $3, $4, $5, $6)",
                     {std::to_string(worker), std::to_string(::getpid()), kind, lock, std::to_string(fence),
                      std::to_string(now_ns())}) == 1)
      return;
}

int run(int worker, int locks, int holds) {
  Resource resource;
  std::vector<std::string> names;
  std::vector<std::unique_ptr<LoadMutex>> mutexes;
  std::vector<int> next(static_cast<std::size_t>(locks), 0);
  for (int k = 0; k < locks; ++k) {
    names.push_back("load_" + std::to_string(k));
    const std::string instance = "w" + std::to_string(worker) + "-" + std::to_string(::getpid()) + "-" + names.back();
    mutexes.push_back(std::make_unique<LoadMutex>(pgmutex::PostgresBackend(dsn), load_options(names.back(), instance)));
    // Resume after the last hold of this lock that completed (a previous life of this worker was SIGKILLed).
    for (;;) {
      const auto done = resource.value(
          "SELECT coalesce(max(seq) + 1, 0) FROM load_holds WHERE worker = $1 AND lock_name = $2 AND end_ns IS NOT NULL",
          {std::to_string(worker), names.back()});
      if (done) {
        next[static_cast<std::size_t>(k)] = std::stoi(*done);
        break;
      }
    }
  }

  std::mt19937 random(static_cast<unsigned>(::getpid()));
  Tally tally;
  bool remaining = true;
  while (remaining) {
    remaining = false;
    for (int step = 0; step < locks; ++step) {
      const int k = (worker + step) % locks;  // workers start on different locks
      int& seq = next[static_cast<std::size_t>(k)];
      if (seq >= holds) continue;
      remaining = true;
      const int before = reclaims.load();
      auto guard = mutexes[static_cast<std::size_t>(k)]->acquire(pgmutex::nothrow, 60s);
      if (!guard || !guard->owns_lock()) {  // an error, or an empty guard: timed out
        ++tally.acquire_errors;
        std::this_thread::sleep_for(20ms);
        continue;
      }
      const bool reclaimed = reclaims.load() != before;
      const std::string& lock = names[static_cast<std::size_t>(k)];
      const std::vector<std::string> key{lock, std::to_string(worker), std::to_string(seq), std::to_string(guard->fence())};
      std::vector<std::string> start = key;
      start.push_back(std::to_string(::getpid()));
      start.push_back(std::to_string(now_ns()));
      start.push_back(reclaimed ? "t" : "f");
      Write w = fenced_write(
          resource, *guard,
          "INSERT INTO load_holds(lock_name, worker, seq, fence, pid, start_ns, reclaimed) VALUES ($1, $2, $3, $4, $5, $6, $7)",
          start,
          "SELECT EXISTS (SELECT 1 FROM load_holds WHERE lock_name = $1 AND worker = $2 AND seq = $3 AND fence = $4)",
          tally);
      if (w == Write::accepted) {
        // The work under the lock: short, and one hold in 50 long enough that
        // the driver's SIGKILL aimed at a holder often lands mid-hold.
        const auto work = random() % 50 == 0 ? std::chrono::microseconds(100000)
                                              : std::chrono::microseconds(random() % 2000);
        std::this_thread::sleep_for(work);
        std::vector<std::string> end = key;
        end.push_back(std::to_string(now_ns()));
        w = fenced_write(resource, *guard,
                         "UPDATE load_holds SET end_ns = $5 WHERE lock_name = $1 AND worker = $2 AND seq = $3 AND fence = $4",
                         end,
                         "SELECT EXISTS (SELECT 1 FROM load_holds WHERE lock_name = $1 AND worker = $2 AND seq = $3 "
                         "AND fence = $4 AND end_ns IS NOT NULL)",
                         tally);
      }
      if (w == Write::accepted) {
        ++seq;
        ++tally.holds;
      } else if (w == Write::rejected) {
        ++tally.rejected;
        record_event(resource, worker, "rejected", lock, guard->fence());
      } else {
        ++tally.lost;
        record_event(resource, worker, "lost", lock, guard->fence());
      }
      if (!guard->release(pgmutex::nothrow)) {  // a failed release leaves a row that goes stale
        ++tally.release_errors;
        record_event(resource, worker, "release_failed", lock, guard->fence());
      }
    }
  }
  std::printf("worker %d (pid %d): %d holds, %d leases lost, %d writes rejected, %d acquire errors, "
              "%d write retries, %d failed releases, %d reclaims\n",
              worker, static_cast<int>(::getpid()), tally.holds, tally.lost, tally.rejected, tally.acquire_errors,
              tally.write_retries, tally.release_errors, reclaims.load());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 1 && args[0] == "schema") {
      LoadMutex mutex(pgmutex::PostgresBackend(dsn), load_options("load_0", "schema"));
      mutex.create_schema();
      return 0;
    }
    if (args.size() == 4 && args[0] == "run") return run(std::stoi(args[1]), std::stoi(args[2]), std::stoi(args[3]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "load_worker: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: load_worker schema | load_worker run WORKER LOCKS HOLDS\n");
  return 2;
}
