// The seeds a simulation test runs: PGMUTEX_SIM_SEED=<seed> replays one;
// else PGMUTEX_SIM_SEEDS (default: the test's own) split into slices by
// PGMUTEX_SIM_SHARD=K/N, the slice pinned to one CPU.
#pragma once

#ifdef __linux__
#include <sched.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

// The simulation runs one thread at a time, but its waiters are threads of
// their own (ManualExecutor::spawn) that hand a baton back and forth, some
// 230 times a seed. A hand-over to a thread on another CPU waits for that
// CPU to wake (an interrupt between virtual CPUs on these machines): 500
// seeds took 6.3 s unpinned and 1.6 s on one CPU. Each slice of the seeds
// (PGMUTEX_SIM_SHARD=K/N) takes the K-th CPU it may use, so parallel slices
// still use every core.
void pin_to_one_cpu(std::uint64_t slice) {
#ifdef __linux__
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.size() < 2) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus[slice % cpus.size()], &one);
  (void)sched_setaffinity(0, sizeof one, &one);  // a hint for speed: unpinned is slower, not wrong
#else
  (void)slice;
#endif
}

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
  pin_to_one_cpu(shard);
  return seeds;
}

}  // namespace
