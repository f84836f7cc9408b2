// Many locks of one process on one connection: a pgmutex::Session.
// Usage: session [DSN]   (no DSN: libpq's PG* environment and .pgpass)
#include <cstdio>
#include <string>
#include <vector>

#include "pgmutex/session.hpp"

using namespace std::chrono_literals;

int main(int argc, char** argv) {
  // One connection and one I/O thread for every mutex made on it.
  pgmutex::SessionOptions options;
  options.heartbeat_tick = 100ms;  // heartbeats due within 100 ms go out as one statement
  auto session = pgmutex::Session::create(argc > 1 ? argv[1] : "", options);

  // One SessionMutex per lock, each with its own options and its own lease.
  std::vector<pgmutex::SessionMutex> shards;
  for (int i = 0; i < 8; ++i)
    shards.emplace_back(session->backend(), pgmutex::Options{.lock_name = "shard-" + std::to_string(i)});
  shards.front().create_schema();

  std::vector<pgmutex::SessionMutex::guard_type> held;
  for (auto& shard : shards)
    if (auto guard = shard.try_acquire()) held.push_back(std::move(guard));

  // A blocking acquire waits on the session's one LISTEN (woken by a
  // release, or when the holder's row goes stale): no polling.
  pgmutex::SessionMutex other(session->backend(), pgmutex::Options{.lock_name = "shard-0"});
  if (auto guard = other.acquire(100ms)) std::printf("unexpected: shard-0 was free\n");

  const pgmutex::SessionStats stats = session->stats();
  std::printf("holding %zu of %zu shards over %llu connection(s)\n", held.size(), shards.size(),
              static_cast<unsigned long long>(stats.connects));
  return held.size() == shards.size() ? 0 : 1;
}
