// The global operator new and delete of the unit test program, counting.
// In a file of their own: where GCC can inline them next to a new-expression
// it warns (-Wmismatched-new-delete) about the malloc/free pair.
#include "allocation_counter.hpp"

#include <cstdlib>
#include <new>

namespace {
thread_local long allocations = 0;
}  // namespace

long pgmutex::test::allocations_on_this_thread() noexcept { return allocations; }

void* operator new(std::size_t size) {
  ++allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
