// The seed of a mutex's grant tokens (pgmutex/detail/token_seed.hpp): the OS's
// entropy read once per process.
#include "pgmutex/detail/token_seed.hpp"

#include <atomic>
#include <random>

namespace pgmutex::detail {
namespace {

std::uint64_t entropy64() {
  std::random_device entropy;
  return (static_cast<std::uint64_t>(entropy()) << 32) ^ entropy();
}

}  // namespace

std::uint64_t token_seed() noexcept {
  // Each call takes the next step of one process-wide sequence whose start
  // came from the OS, then mixes it (splitmix64's output function): seeds
  // never repeat within a process, and the mix keeps them far apart.
  static std::atomic<std::uint64_t> state{entropy64()};
  std::uint64_t z = state.fetch_add(0x9E3779B97F4A7C15ULL, std::memory_order_relaxed) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace pgmutex::detail
