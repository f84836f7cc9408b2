// pgmutex run --metrics-file: what one run did, written for node_exporter's
// textfile collector (run_report.hpp).
#include "run_report.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "record_exposition.hpp"
#include "run_report_description.hpp"
#include "terminal_text.hpp"

namespace pgmutex::cli {
namespace {

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = EIO;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// PATH's folder, and a name there that the textfile collector ignores (it reads *.prom only).
std::string temporary_name(const std::string& path) {
  const auto slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return folder + "." + base + "." + std::to_string(::getpid()) + ".tmp";
}

}  // namespace

std::string_view to_string(LockOutcome outcome) noexcept {
  switch (outcome) {
    case LockOutcome::none: return "none";
    case LockOutcome::taken: return "taken";
    case LockOutcome::acquired: return "acquired";
    case LockOutcome::lost: return "lost";
  }
  return "?";
}

std::string format_run_report(const RunReport& report) {
  std::string out;
  write_metrics<RunReport>(out, std::span(&report, 1));
  return out;
}

RunMetricsFile::RunMetricsFile(std::string path, std::string lock, std::string instance)
    : path_(std::move(path)), started_(std::chrono::steady_clock::now()), wait_started_(started_) {
  report_.lock = std::move(lock);
  report_.instance = std::move(instance);
  report_.start_time = seconds_since_epoch();
}

void RunMetricsFile::set_instance(std::string_view instance) {
  std::lock_guard hold(mutex_);
  report_.instance = instance;
}

void RunMetricsFile::wait_started() {
  std::lock_guard hold(mutex_);
  wait_started_ = std::chrono::steady_clock::now();
}

void RunMetricsFile::wait_ended(LockOutcome outcome, Fence fence) {
  std::lock_guard hold(mutex_);
  report_.lock_wait = std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_started_).count();
  report_.lock_outcome = outcome;
  report_.fence = static_cast<double>(fence);
}

void RunMetricsFile::lost() {
  std::lock_guard hold(mutex_);
  report_.lock_outcome = LockOutcome::lost;
}

void RunMetricsFile::heartbeat_failed() {
  std::lock_guard hold(mutex_);
  ++report_.heartbeat_retries;
  ++failed_in_a_row_;
}

int RunMetricsFile::heartbeat_succeeded() {
  std::lock_guard hold(mutex_);
  return std::exchange(failed_in_a_row_, 0);
}

void RunMetricsFile::write(int exit_code) noexcept {
  if (path_.empty()) return;
  try {
    std::string text;
    {
      std::lock_guard hold(mutex_);
      if (written_) return;
      written_ = true;
      report_.exit_code = exit_code;
      report_.end_time = seconds_since_epoch();
      report_.duration = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      text = format_run_report(report_);
    }
    const std::string temporary = temporary_name(path_);
    int error = 0;  // the first failure's errno
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || !write_all(fd, text) || ::fsync(fd) != 0) error = errno;
    if (fd >= 0 && ::close(fd) != 0 && error == 0) error = errno;
    if (error == 0 && ::rename(temporary.c_str(), path_.c_str()) != 0) error = errno;
    if (error != 0) {
      const std::string line = "pgmutex: warning: could not write the metrics file " + shown(path_) + ": " +
                               std::strerror(error) + "\n";
      [[maybe_unused]] const auto n = ::write(STDERR_FILENO, line.data(), line.size());
      ::unlink(temporary.c_str());
    }
  } catch (...) {
    // Out of memory while formatting: the exit code matters more than the file.
  }
}

}  // namespace pgmutex::cli
