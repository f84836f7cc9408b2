// A portable, seeded PRNG for simulations: the same seed gives the same
// numbers on every compiler and standard library (std:: distributions do not).
#pragma once

#include <cstdint>
#include <string_view>

namespace pgmutex::testing {

// SplitMix64 (Steele, Lea, Flood 2014): small, fast, and good enough for test
// schedules. Sub-seeds let each component draw its own stream from one root
// seed, so adding a draw in one component does not shift the others.
class Prng {
 public:
  explicit constexpr Prng(std::uint64_t seed) noexcept : state_(seed) {}

  constexpr std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

  // In [0, bound): the modulo bias is below 2^-40 for the small bounds tests use.
  constexpr std::uint64_t below(std::uint64_t bound) noexcept { return next() % bound; }

  // Uniform in [low, high].
  constexpr std::int64_t between(std::int64_t low, std::int64_t high) noexcept {
    return low + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(high - low) + 1));
  }

  // True with probability numerator / denominator.
  constexpr bool chance(std::uint64_t numerator, std::uint64_t denominator) noexcept {
    return below(denominator) < numerator;
  }

  // A stream of its own for a named component, derived from this one's seed.
  [[nodiscard]] constexpr Prng fork(std::string_view component) const noexcept {
    std::uint64_t hash = 0xCBF29CE484222325ULL;  // FNV-1a
    for (char c : component) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001B3ULL;
    return Prng(state_ ^ hash);
  }

 private:
  std::uint64_t state_;
};

}  // namespace pgmutex::testing
