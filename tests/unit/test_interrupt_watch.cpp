// The wait's signal thread (tools/interrupt_watch.hpp): an interrupt during
// the wait cancels it; one that comes as the lock is granted is never lost,
// whichever of the thread and the next reader reads it.
#include <signal.h>
#include <unistd.h>

#include <optional>

#include <catch2/catch.hpp>

#include "interrupt_watch.hpp"
#include "signals.hpp"

using pgmutex::cli::InterruptWatch;
using pgmutex::cli::SignalReader;

namespace {

// The next supervised signal the reader has, waiting up to 5 s.
std::optional<int> next_signal(SignalReader& signals) {
  for (int i = 0; i < 500; ++i) {
    if (auto info = signals.next()) return static_cast<int>(info->ssi_signo);
    ::usleep(10'000);
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("an interrupt during the wait cancels it; one after the grant reaches the next reader", "[cli][signals]") {
  // As pgmutex does before any thread: every thread inherits the mask.
  pgmutex::cli::block_supervised_signals();
  SignalReader signals;

  SECTION("during the wait: the stop token stops, and stop_at_grant() says which signal") {
    InterruptWatch interrupts(signals);
    interrupts.start_waiting();
    ::kill(::getpid(), SIGUSR1);
    for (int i = 0; i < 500 && !interrupts.stop_token().stop_requested(); ++i) ::usleep(10'000);
    CHECK(interrupts.stop_token().stop_requested());
    CHECK(interrupts.stop_at_grant() == SIGUSR1);
    interrupts.finish();
    CHECK_FALSE(signals.next());  // acted on by the caller: not raised again
  }
  SECTION("as the grant comes: acted on, or raised again for the supervisor, never lost") {
    // The signal and the grant race: the thread reads it before the stop
    // (the caller sees it and acts), or after (raised again when joined),
    // or never (left for the next reader). 50 rounds meet each case.
    int seen = 0;
    int passed_on = 0;
    for (int round = 0; round < 50; ++round) {
      InterruptWatch interrupts(signals);
      interrupts.start_waiting();
      ::usleep(1'000);  // the thread is in poll()
      ::kill(::getpid(), SIGUSR2);
      const int at_grant = interrupts.stop_at_grant();
      interrupts.finish();
      if (at_grant != 0) {
        CHECK(at_grant == SIGUSR2);
        ++seen;
        CHECK_FALSE(signals.next());
      } else {
        CHECK(next_signal(signals) == SIGUSR2);
        ++passed_on;
      }
    }
    CHECK(seen + passed_on == 50);
  }
}
