// What every integration test needs: the server scripts/with-postgres started
// (the tests fail, never skip, without it), fresh table names, an admin
// connection, and child processes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <pqxx/pqxx>

#include "pgmutex/mutex.hpp"

namespace itest {

using namespace std::chrono_literals;

// The variable's value; fails the current test, naming what is missing, if unset.
inline std::string need_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0')
    FAIL(std::string(name) +
         " is not set: the integration tests need the throwaway server that scripts/with-postgres starts. "
         "Run: scripts/with-postgres meson test -C <builddir> --suite integration");
  return value;
}

struct Server {
  std::string pgdata = need_env("PGMUTEX_TEST_PGDATA");
  std::string pgbin = need_env("PGMUTEX_TEST_PGBIN");
  std::string pgctl = need_env("PGMUTEX_TEST_PGCTL");
  std::string socket_dir = need_env("PGHOST");
  std::string port = need_env("PGPORT");
  std::string user = need_env("PGUSER");
  std::string database = need_env("PGDATABASE");
  std::string tcp_host = need_env("PGMUTEX_TEST_TCP_HOST");
  std::string password_role = need_env("PGMUTEX_TEST_PASSWORD_ROLE");
  std::string password = need_env("PGMUTEX_TEST_PASSWORD");
};

inline Server server() { return Server{}; }

// Polls `done` every 10 ms until it holds or `limit` passes; true if it held.
template <class F>
bool eventually(F done, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// A table name no other test (or test process) uses. Checks the server's
// variables first, so that every test fails clearly without them.
inline std::string fresh_table(std::string_view stem) {
  (void)server();
  static int counter = 0;
  return std::string(stem) + "_" + std::to_string(::getpid()) + "_" + std::to_string(++counter);
}

// One statement on a fresh connection from the environment.
// Bytes of WAL written (by anyone) while `work` runs.
inline long long wal_bytes_during(const std::function<void()>& work) {
  pqxx::connection c("");
  pqxx::nontransaction tx(c);
  const auto before = tx.exec("SELECT pg_current_wal_insert_lsn()")[0][0].as<std::string>();
  work();
  return tx.exec("SELECT pg_current_wal_insert_lsn() - '" + before + "'::pg_lsn")[0][0].as<long long>();
}

inline pqxx::result admin(const std::string& sql) {
  pqxx::connection c("");
  pqxx::nontransaction tx(c);
  return tx.exec(sql);
}

// A table made with the seed package's exact DDL (no fence, no grant
// columns), in a fresh schema of its own: returns "schema.mutex_lock".
inline std::string seed_made_table(std::string_view stem) {
  const std::string schema = fresh_table(stem);
  admin("CREATE SCHEMA " + schema);
  admin("CREATE TABLE " + schema +
        ".mutex_lock ("
        "  lock_name      VARCHAR(64) NOT NULL,"
        "  locked         INT NOT NULL DEFAULT 1,"
        "  instance_id    VARCHAR(64) NOT NULL,"
        "  last_heartbeat TIMESTAMPTZ NOT NULL,"
        "  acquired_at    TIMESTAMPTZ NOT NULL,"
        "  CONSTRAINT uq_mutex_lock UNIQUE (locked, lock_name),"
        "  CONSTRAINT chk_locked CHECK (locked = 1))");
  return schema + ".mutex_lock";
}

inline pgmutex::Options options(std::string table, std::string lock, std::string instance = {}) {
  pgmutex::Options o;
  o.table = std::move(table);
  o.lock_name = std::move(lock);
  o.instance_id = std::move(instance);
  o.poll_interval = 50ms;
  return o;
}

// The server pids of the sessions that named themselves `application_name`.
inline std::vector<int> sessions_of(const std::string& application_name) {
  std::vector<int> pids;
  for (const auto& row : admin("SELECT pid FROM pg_stat_activity WHERE application_name = '" + application_name + "'"))
    pids.push_back(row[0].as<int>());
  return pids;
}

// pg_terminate_backend on those sessions; returns once they are gone.
inline void terminate_sessions_of(const std::string& application_name) {
  admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '" + application_name + "'");
  for (int i = 0; i < 100 && !sessions_of(application_name).empty(); ++i) std::this_thread::sleep_for(20ms);
  REQUIRE(sessions_of(application_name).empty());
}

// The helper program's path (tests/integration/child.cpp), from meson.
inline std::string child_program() { return need_env("PGMUTEX_TEST_CHILD"); }

// Starts the child program with `args`; its stdout is read through `out_fd`.
struct Child {
  pid_t pid = -1;
  int out_fd = -1;
};
Child spawn_child(const std::vector<std::string>& args);
// Reads one line from the child's stdout, waiting at most `timeout`.
std::string read_line(const Child& child, std::chrono::milliseconds timeout);
// Waits for the child; returns its exit status (or 128 + signal).
int wait_child(Child& child);

}  // namespace itest
