// pgmutex run without a command (as etcdctl lock NAME): the wait while the
// lock is held for whoever started pgmutex, until they let it go.
#pragma once

#include "signals.hpp"

namespace pgmutex::cli {

enum class HoldEnd {
  signal,        // a signal that ends a process by default (SIGINT, SIGTERM, SIGHUP, ...)
  input_closed,  // stdin reached its end: the holder's side of a pipe went away
  lost,          // the lease was lost
};

// Whether the end of stdin lets go: run's hold (for whoever holds the other
// end of a pipe), not elect's (held until a signal, as etcdctl elect is).
enum class HoldInput { watched, ignored };

struct HoldResult {
  HoldEnd end = HoldEnd::signal;
  int signo = 0;  // with HoldEnd::signal
};

// Blocks until one of the three (two with HoldInput::ignored). What arrives on stdin is read and dropped;
// a stdin that is not open, or a terminal a background job may not read, is
// never waited for. Signals must be blocked
// (block_supervised_signals) and are read from `signals`.
[[nodiscard]] HoldResult hold_until_let_go(SignalReader& signals, const Wakeup& lost,
                                         HoldInput input = HoldInput::watched);

}  // namespace pgmutex::cli
