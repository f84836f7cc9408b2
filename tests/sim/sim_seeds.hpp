// The seeds a simulation test runs: PGMUTEX_SIM_SEED=<seed> replays one;
// else PGMUTEX_SIM_SEEDS (default: the test's own) split into slices by
// PGMUTEX_SIM_SHARD=K/N. A slice runs on one thread (its simulated threads
// are fibers: ManualExecutor::spawn); slices side by side use more cores.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : fallback;
}

std::vector<std::uint64_t> seeds_of_this_run(std::uint64_t default_seeds) {
  std::vector<std::uint64_t> seeds;
  if (const char* chosen = std::getenv("PGMUTEX_SIM_SEED")) {
    seeds.push_back(std::strtoull(chosen, nullptr, 10));
    return seeds;
  }
  const std::uint64_t total = env_number("PGMUTEX_SIM_SEEDS", default_seeds);
  std::uint64_t shard = 0, shards = 1;
  if (const char* slice = std::getenv("PGMUTEX_SIM_SHARD")) {
    std::string text(slice);
    shard = std::stoull(text.substr(0, text.find('/')));
    shards = std::stoull(text.substr(text.find('/') + 1));
  }
  for (std::uint64_t s = 1 + shard; s <= total; s += shards) seeds.push_back(s);
  return seeds;
}

}  // namespace
