// What the benchmarks compare pgmutex with: the backend's own statements sent
// by plain libpq on one connection. Shared, so that every comparison sends
// the same parameters (a copy once fell behind the acquire's ninth).
#pragma once

#include <libpq-fe.h>

#include <benchmark/benchmark.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "pgmutex/postgres_backend.hpp"
#include "sql.hpp"

namespace bench {

// One libpq connection from the environment (PGHOST, ...), prepared statements.
class Pq {
 public:
  Pq() : conn_(PQconnectdb("")) {
    if (PQstatus(conn_) != CONNECTION_OK) throw std::runtime_error(PQerrorMessage(conn_));
  }
  Pq(const Pq&) = delete;
  Pq& operator=(const Pq&) = delete;
  ~Pq() { PQfinish(conn_); }

  void exec(const std::string& sql) { check(PQexec(conn_, sql.c_str()), sql); }
  void prepare(const std::string& name, const std::string& sql) {
    check(PQprepare(conn_, name.c_str(), sql.c_str(), 0, nullptr), sql);
  }
  // Runs a prepared statement; returns the first column of the first row ("" if none).
  std::string run(const std::string& name, const std::vector<std::string>& params) {
    std::vector<const char*> values;
    for (const std::string& p : params) values.push_back(p.c_str());
    PGresult* r = PQexecPrepared(conn_, name.c_str(), static_cast<int>(values.size()), values.data(), nullptr,
                                 nullptr, 0);
    const auto status = PQresultStatus(r);
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
      const std::string message = PQresultErrorMessage(r);
      PQclear(r);
      throw std::runtime_error(name + ": " + message);
    }
    std::string first = PQntuples(r) > 0 && !PQgetisnull(r, 0, 0) ? PQgetvalue(r, 0, 0) : "";
    PQclear(r);
    return first;
  }

 private:
  static void check(PGresult* r, const std::string& what) {
    const auto status = PQresultStatus(r);
    const std::string message = PQresultErrorMessage(r);
    PQclear(r);
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) throw std::runtime_error(what + ": " + message);
  }
  PGconn* conn_;
};

// The lock table made (as create_schema makes it) and emptied.
inline void setup_table(const std::string& table) {
  pgmutex::PostgresBackend b("");
  if (auto created = b.create_schema(table); !created) throw std::runtime_error(created.error().message());
  Pq pq;
  pq.exec("DELETE FROM " + table);
}

// The uncontended cycle as plain libpq sends it: the backend's acquire and
// release statements on lock "job" of `table`, with the parameters the
// backend sends.
inline void libpq_cycle(benchmark::State& state, const std::string& table, const std::string& program) {
  setup_table(table);
  const auto sql = pgmutex::postgres_detail::make_statements(table, true);
  const std::string lock_hash = pgmutex::postgres_detail::lock_hash("job");
  Pq pq;
  pq.prepare("acquire", sql.acquire.sql);
  pq.prepare("release", sql.release.sql);
  for (auto _ : state) {
    // lock, instance, stale seconds, token, lock_timeout (ms), host, pid,
    // program, failover grace ("-1": the default).
    const std::string fence =
        pq.run("acquire", {"job", "libpq", "600", "12345", "5000", "bench-host", "4242", program, "-1"});
    if (fence.empty()) state.SkipWithError("not acquired");
    pq.run("release", {"job", "libpq", fence, "12345", lock_hash, "5000"});
  }
}

}  // namespace bench
