// A simulated thread of ManualExecutor::spawn: a body that runs on a stack
// of its own and is switched to and from on the thread that resumes it, one
// at a time. A switch is a few dozen instructions and no system call, where a
// hand-over between OS threads cost two kernel context switches (several
// microseconds each on a VM; glibc's swapcontext makes a system call too, to
// set the signal mask). Each fiber keeps its own copy of what the library
// keeps per thread (detail::ThreadLocals) and of the C++ runtime's exception
// state, as a thread does, and the sanitizers are told of every switch (ASan:
// the stack in use; TSan: which thread runs, each switch a synchronization,
// as the baton's hand-over was; LSan: a live fiber's stack is scanned, as a
// thread's). A fiber is resumed on the thread it first ran on. Not part of
// the API.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <cxxabi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "pgmutex/detail/thread_locals.hpp"

#if defined(__has_feature)
#define PGMUTEX_FIBER_HAS_FEATURE(x) __has_feature(x)
#else
#define PGMUTEX_FIBER_HAS_FEATURE(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || PGMUTEX_FIBER_HAS_FEATURE(address_sanitizer)
#define PGMUTEX_FIBER_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/lsan_interface.h>
#else
#define PGMUTEX_FIBER_ASAN 0
#endif
#if defined(__SANITIZE_THREAD__) || PGMUTEX_FIBER_HAS_FEATURE(thread_sanitizer)
#define PGMUTEX_FIBER_TSAN 1
#include <sanitizer/tsan_interface.h>
#else
#define PGMUTEX_FIBER_TSAN 0
#endif

#if defined(__x86_64__)
// Saves the callee-saved registers (and the SSE and x87 control words) on
// this stack and its stack pointer in *save, then loads `load`'s and returns
// there. One copy in the program, whichever units include this (a COMDAT
// group, as the compiler emits an inline function).
extern "C" void pgmutex_fiber_switch(void** save, void* load) noexcept;
__asm__(R"(
  .pushsection .text.pgmutex_fiber_switch,"axG",@progbits,pgmutex_fiber_switch,comdat
  .weak pgmutex_fiber_switch
  .hidden pgmutex_fiber_switch
  .type pgmutex_fiber_switch,@function
pgmutex_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size pgmutex_fiber_switch, .-pgmutex_fiber_switch
  .popsection
)");
#endif

namespace pgmutex::detail {

// A fiber's stack, with a guard page below it, and under TSan the state TSan
// keeps for the thread that runs on it: TSan sees the bodies that ran on one
// stack as one thread, which costs it nothing it could find (every switch
// synchronizes, so one body's accesses all happen before the next one's).
struct FiberStack {
  std::byte* bottom = nullptr;
  void* tsan_fiber = nullptr;
};

// Stacks, kept for the next fiber of this thread once one ends: a new
// mapping and its first page faults cost tens of microseconds on a VM (and
// TSan's state for a new fiber a millisecond), and a simulation starts
// fibers by the thousand.
class FiberStacks {
 public:
  // Pages are committed as touched. The simulations' bodies reach 7 KiB at
  // -O2 and 31 KiB at -O0 under ASan.
  static constexpr std::size_t size = std::size_t{256} << 10;

  static FiberStack take() {
    std::vector<FiberStack>& kept = here().kept_;
    if (!kept.empty()) {
      const FiberStack stack = kept.back();
      kept.pop_back();
      return stack;
    }
    const std::size_t guard = page();
    void* mapping = mmap(nullptr, guard + size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (mapping == MAP_FAILED) throw std::bad_alloc();
    (void)mprotect(mapping, guard, PROT_NONE);  // an overflow faults here rather than writing past the stack
    FiberStack stack{static_cast<std::byte*>(mapping) + guard};
#if PGMUTEX_FIBER_TSAN
    stack.tsan_fiber = __tsan_create_fiber(0);
#endif
    return stack;
  }
  static void give_back(FiberStack stack) noexcept {
    std::vector<FiberStack>& kept = here().kept_;
    try {
      if (kept.size() < 64) return kept.push_back(stack);
    } catch (...) {
    }
    unmap(stack);
  }

  ~FiberStacks() {
    for (const FiberStack& stack : kept_) unmap(stack);
  }

 private:
  static FiberStacks& here() {
    static thread_local FiberStacks stacks;
    return stacks;
  }
  static std::size_t page() noexcept { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }
  static void unmap(const FiberStack& stack) noexcept {
#if PGMUTEX_FIBER_TSAN
    __tsan_destroy_fiber(stack.tsan_fiber);
#endif
    (void)munmap(stack.bottom - page(), page() + size);
  }

  std::vector<FiberStack> kept_;
};

class Fiber : public std::enable_shared_from_this<Fiber> {
 public:
  explicit Fiber(std::function<void()> body) : body_(std::move(body)), stack_(FiberStacks::take()) {
    locals_.simulated_thread = this;
#if defined(__x86_64__)
    // What pgmutex_fiber_switch pops: the control words, six registers, and
    // the address it returns to, the entry, whose own return address is
    // null (backtraces end there). The entry starts with the stack aligned
    // as after a call.
    void** sp = reinterpret_cast<void**>(stack_.bottom + FiberStacks::size);
    *--sp = nullptr;
    *--sp = reinterpret_cast<void*>(&Fiber::entry);
    for (int r = 0; r < 6; ++r) *--sp = nullptr;
    unsigned control[2] = {0, 0};
    __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(control[0]), "=m"(control[1]));
    *--sp = reinterpret_cast<void*>(static_cast<std::uintptr_t>(control[0]) |
                                    (static_cast<std::uintptr_t>(control[1] & 0xffff) << 32));
    context_ = sp;
#else
    getcontext(&context_);
    context_.uc_stack.ss_sp = stack_.bottom;
    context_.uc_stack.ss_size = FiberStacks::size;
    context_.uc_link = nullptr;
    makecontext(&context_, &Fiber::entry, 0);
#endif
#if PGMUTEX_FIBER_ASAN
    __lsan_register_root_region(stack_.bottom, FiberStacks::size);
#endif
  }
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // One never resumed to its end waits for ever, as a thread blocked for
  // ever would: its stack stays (what it refers to is not a leak).
  ~Fiber() {
    if (stack_.bottom != nullptr && (!started_ || ended_)) release_stack();
  }

  // The fiber running on this thread (inside its body), or null.
  [[nodiscard]] static Fiber* current() noexcept { return current_; }
  [[nodiscard]] bool done() const noexcept { return ended_; }

  // Runs the body until it suspends or returns; then the caller goes on.
  void resume() {
    if (!started_) home_ = &thread_locals();
    else if (home_ != &thread_locals()) wrong_thread();
    started_ = true;
    Fiber* const outer = std::exchange(current_, this);
    swap_thread_state();
#if PGMUTEX_FIBER_ASAN
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, stack_.bottom, FiberStacks::size);
#endif
#if PGMUTEX_FIBER_TSAN
    resumer_tsan_ = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(stack_.tsan_fiber, 0);
#endif
    jump(resumer_, context_);
#if PGMUTEX_FIBER_ASAN
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
    swap_thread_state();
    current_ = outer;
    if (ended_) release_stack();
  }

  // From the body: back to whoever resumed it, until resumed again.
  void suspend() {
#if PGMUTEX_FIBER_ASAN
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, resumer_stack_, resumer_stack_size_);
#endif
#if PGMUTEX_FIBER_TSAN
    __tsan_switch_to_fiber(resumer_tsan_, 0);
#endif
    jump(context_, resumer_);
#if PGMUTEX_FIBER_ASAN
    __sanitizer_finish_switch_fiber(fake_stack, &resumer_stack_, &resumer_stack_size_);
#endif
  }

 private:
#if defined(__x86_64__)
  using Context = void*;  // the stack pointer pgmutex_fiber_switch left
  static void jump(Context& save, Context& load) noexcept { pgmutex_fiber_switch(&save, load); }
#else
  using Context = ucontext_t;
  static void jump(Context& save, Context& load) noexcept { (void)swapcontext(&save, &load); }
#endif

  // The Itanium C++ ABI's __cxa_eh_globals: the exceptions being handled
  // (a catch block's, std::current_exception's) and how many are in flight.
  struct ExceptionState {
    void* caught;
    unsigned int uncaught;
#if defined(__ARM_EABI_UNWINDER__)
    void* propagating;
#endif
  };
  static ExceptionState& exception_state() noexcept {
    return *reinterpret_cast<ExceptionState*>(abi::__cxa_get_globals());
  }
  // The thread's per-thread state for the fiber's, or back.
  void swap_thread_state() noexcept {
    std::swap(thread_locals(), locals_);
    std::swap(exception_state(), exceptions_);
  }

  // The body runs here, on the fiber's stack; what it captured goes with it
  // (so a fiber left waiting for ever holds it from its stack, as a thread).
  [[noreturn]] static void entry() noexcept {
    Fiber* const self = current_;
#if PGMUTEX_FIBER_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &self->resumer_stack_, &self->resumer_stack_size_);
#endif
    {
      std::function<void()> body = std::move(self->body_);
      body();
    }
    self->ended_ = true;
#if PGMUTEX_FIBER_ASAN
    __sanitizer_start_switch_fiber(nullptr, self->resumer_stack_, self->resumer_stack_size_);
#endif
#if PGMUTEX_FIBER_TSAN
    __tsan_switch_to_fiber(self->resumer_tsan_, 0);
#endif
    jump(self->context_, self->resumer_);
    std::abort();  // never resumed again
  }

  void release_stack() noexcept {
#if PGMUTEX_FIBER_ASAN
    __lsan_unregister_root_region(stack_.bottom, FiberStacks::size);
    __asan_unpoison_memory_region(stack_.bottom, FiberStacks::size);  // the entry's frame never returned
#endif
    FiberStacks::give_back(std::exchange(stack_, FiberStack{}));
  }

  [[noreturn]] static void wrong_thread() noexcept {
    std::fputs("pgmutex: a ManualExecutor's spawned body was resumed on another thread than the one it ran on\n", stderr);
    std::abort();
  }

  static inline thread_local Fiber* current_ = nullptr;

  std::function<void()> body_;
  FiberStack stack_;
  Context context_{};
  Context resumer_{};
  ThreadLocals locals_;
  ExceptionState exceptions_{};
  const void* home_ = nullptr;
  bool started_ = false;
  bool ended_ = false;
#if PGMUTEX_FIBER_ASAN
  const void* resumer_stack_ = nullptr;
  std::size_t resumer_stack_size_ = 0;
#endif
#if PGMUTEX_FIBER_TSAN
  void* resumer_tsan_ = nullptr;
#endif
};

}  // namespace pgmutex::detail

#undef PGMUTEX_FIBER_HAS_FEATURE
#undef PGMUTEX_FIBER_ASAN
#undef PGMUTEX_FIBER_TSAN
