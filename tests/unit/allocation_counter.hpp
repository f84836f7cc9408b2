// How many times the global operator new has run on this thread: the unit
// test program replaces it (allocation_counter.cpp) to count, nothing else.
#pragma once

namespace pgmutex::test {

long allocations_on_this_thread() noexcept;

}  // namespace pgmutex::test
