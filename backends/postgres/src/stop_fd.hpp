// A descriptor that becomes readable when a std::stop_token is requested, for
// poll() beside a connection's socket (queue_waits.cpp, election_waits.cpp).
// Private to the backend.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <stop_token>

namespace pgmutex::postgres_detail {

// A descriptor that becomes readable when `stop` is requested, for poll().
class StopFd {
 public:
  explicit StopFd(std::stop_token stop) : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    on_stop_.emplace(std::move(stop), [fd = fd_] {
      const std::uint64_t one = 1;
      if (fd >= 0) (void)!::write(fd, &one, sizeof one);
    });
  }
  StopFd(const StopFd&) = delete;
  StopFd& operator=(const StopFd&) = delete;
  // The callback goes first: its destructor waits for a run on another
  // thread (a signal's stop) to finish, so nothing writes to the
  // descriptor once it is closed (and perhaps reused).
  ~StopFd() {
    on_stop_.reset();
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int fd() const noexcept { return fd_; }

 private:
  int fd_;
  std::optional<std::stop_callback<std::function<void()>>> on_stop_;
};

}  // namespace pgmutex::postgres_detail
