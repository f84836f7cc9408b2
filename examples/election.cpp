// Leader election: a service campaigns, announces its address, serves while
// it leads (stopping at once if its lease is lost), proclaims a new address,
// and steps down; a standby waiting in line takes over with a higher term.
// Usage: election [DSN]   (no DSN: libpq's PG* environment and .pgpass)
#include <cstdio>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>

#include "pgmutex/mutex.hpp"

using namespace std::chrono_literals;

// The service's work while it leads: until done, or `stop` (the lease lost).
void serve_until(std::stop_token stop) {
  for (int request = 0; request < 5 && !stop.stop_requested(); ++request) std::this_thread::sleep_for(10ms);
}

int main(int argc, char** argv) {
  const std::string dsn = argc > 1 ? argv[1] : "";
  pgmutex::Election election(pgmutex::PostgresBackend(dsn), {.lock_name = "primary", .instance_id = "web-1"});
  election.create_schema();
  auto leadership = election.campaign("10.0.0.7:8080");  // waits in line; its grant announces
  serve_until(leadership.stop_token());                   // stopped if the lease is lost
  leadership.proclaim("10.0.0.7:8081");                    // a new value, the same term

  // A standby campaigns too: it waits in line, making no statement meanwhile.
  std::optional<pgmutex::Election::leadership_type> standby_leads;
  std::thread standby([&] {
    pgmutex::Election candidate(pgmutex::PostgresBackend(dsn), {.lock_name = "primary", .instance_id = "web-2"});
    standby_leads = candidate.campaign("10.0.0.8:8080", 30s);
  });
  std::this_thread::sleep_for(200ms);
  if (auto now = election.leader()) std::printf("leader: %s (term %lld)\n", now->value.c_str(), static_cast<long long>(now->term));
  const pgmutex::Fence first_term = leadership.term();
  leadership.resign();                                     // or let it go out of scope
  standby.join();

  auto now = election.leader();
  if (!standby_leads || !*standby_leads || !now || now->instance_id != "web-2" || now->term <= first_term) {
    std::printf("unexpected: the standby does not lead\n");
    return 1;
  }
  std::printf("leader: %s (term %lld)\n", now->value.c_str(), static_cast<long long>(now->term));
  return 0;
}
