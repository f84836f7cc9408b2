// A standby that never campaigns: it observes the election and routes
// requests to whoever leads, reacting to each change as it happens (NOTIFY,
// no polling). Here the leader is a thread of the same program; in practice
// it is another process or machine (examples/election.cpp).
// Usage: standby [DSN]   (no DSN: libpq's PG* environment and .pgpass)
#include <cstdio>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "pgmutex/mutex.hpp"

using namespace std::chrono_literals;

// Where requests go: the leader's announced address, or nowhere.
class Router {
 public:
  void on_change(const pgmutex::LeaderChange& change) {
    std::lock_guard lock(mutex_);
    route_to_ = change.leader ? change.leader->value : std::string();
    if (change.gap) std::printf("missed %s change(s): routing by the present\n",
                                change.missed ? std::to_string(*change.missed).c_str() : "some");
    std::printf("term %lld: %s\n", static_cast<long long>(change.term),
                route_to_.empty() ? "nobody leads, requests wait" : ("route to " + route_to_).c_str());
    seen_.push_back(change.event);
  }
  std::vector<pgmutex::LeaderEvent> seen() {
    std::lock_guard lock(mutex_);
    return seen_;
  }

 private:
  std::mutex mutex_;
  std::string route_to_;
  std::vector<pgmutex::LeaderEvent> seen_;
};

int main(int argc, char** argv) {
  const std::string dsn = argc > 1 ? argv[1] : "";
  const pgmutex::Options options{.lock_name = "router-demo", .instance_id = "router-1"};
  pgmutex::Observer observer(pgmutex::PostgresBackend(dsn), options);
  observer.create_schema();  // as pgmutex schema would have, once
  Router router;
  std::jthread watching([&](std::stop_token stop) {
    observer.observe([&](const pgmutex::LeaderChange& c) { router.on_change(c); }, stop);
  });

  // Elsewhere, a service leads for a while, moves, and steps down.
  pgmutex::Election service(pgmutex::PostgresBackend(dsn), {.lock_name = "router-demo", .instance_id = "api-1"});
  std::this_thread::sleep_for(300ms);  // the router reports who leads now first
  {
    auto leadership = service.campaign("10.0.0.7:8080");
    std::this_thread::sleep_for(100ms);
    leadership.proclaim("10.0.0.7:8081");
    std::this_thread::sleep_for(100ms);
  }  // resigns
  std::this_thread::sleep_for(300ms);
  watching.request_stop();
  watching.join();

  using E = pgmutex::LeaderEvent;
  const std::vector<E> expected{E::current, E::elected, E::proclaimed, E::vacated};
  if (router.seen() != expected) {
    std::printf("unexpected: the router saw %zu change(s), not the 4 in order\n", router.seen().size());
    return 1;
  }
  return 0;
}
