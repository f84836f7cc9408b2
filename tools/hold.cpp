// pgmutex run without a command (hold.hpp): the lock held until whoever started
// pgmutex lets it go.
#include "hold.hpp"

#include <poll.h>
#include <unistd.h>

#include <array>
#include <cerrno>

namespace pgmutex::cli {

HoldResult hold_until_let_go(SignalReader& signals, const Wakeup& lost, HoldInput input) {
  bool watch_input = input == HoldInput::watched;
  for (;;) {
    std::array<pollfd, 3> fds{{{signals.fd(), POLLIN, 0}, {lost.fd(), POLLIN, 0}, {watch_input ? STDIN_FILENO : -1, POLLIN, 0}}};
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return {HoldEnd::lost, 0};  // cannot wait: give the lock up rather than hold it blind
    }
    if (fds[1].revents != 0 && lost.drain()) return {HoldEnd::lost, 0};
    if (fds[0].revents != 0)
      while (const auto signal = signals.next())
        if (role_of(static_cast<int>(signal->ssi_signo)) == SignalRole::ending)
          return {HoldEnd::signal, static_cast<int>(signal->ssi_signo)};
    if (fds[2].revents & POLLNVAL) {
      watch_input = false;  // stdin is closed: only a signal or a loss ends the hold
    } else if (fds[2].revents != 0) {
      std::array<char, 4096> buffer;
      const ssize_t got = read(STDIN_FILENO, buffer.data(), buffer.size());
      // EIO: a terminal we may not read from (a background job's): no end of input will come.
      if (got < 0 && errno == EIO) watch_input = false;
      else if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) return {HoldEnd::input_closed, 0};
    }
  }
}

}  // namespace pgmutex::cli
