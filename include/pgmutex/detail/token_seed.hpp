// The seed of a mutex's grant tokens: random across processes, distinct
// within one. Compiled (src/token_seed.cpp): the OS's entropy is read once
// per process, not per mutex (a std::random_device costs microseconds, and a
// Session may hold thousands of mutexes).
#pragma once

#include <cstdint>

namespace pgmutex::detail {

[[nodiscard]] std::uint64_t token_seed() noexcept;

}  // namespace pgmutex::detail
