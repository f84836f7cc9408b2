// The library's load for the HA scenarios (issue 19, tests/cli/patroni_test.sh):
// holders that log when they believe they hold a lock, so that a checker
// (tests/tools/check_holds.py) can judge a failover by the logs alone.
//
//   ha_load session WHO DSN TABLE PREFIX COUNT LOG [STALE_S]
//       one Session holding COUNT locks PREFIX0..PREFIX{COUNT-1}: a thread per
//       lock acquires it (waiting), holds it until the lease is lost or the
//       program is told to stop, and acquires it again after a loss
//   ha_load asio WHO DSN TABLE PREFIX COUNT LOG [STALE_S]
//       an AsioMutex service: COUNT coroutines on one io_context (one Session)
//       each loop: acquire (waiting), work (cut short by a lost lease),
//       release; the work takes 300 ms on even-numbered locks and 8 s on
//       odd ones: longer than a 6 s lease, so a failover catches it
// Locks are named PREFIX0, PREFIX1, ...; every lock beats once a second and
// goes stale after STALE_S seconds (default 6; its alert at half that).
//
// Each line of LOG is "MICROSECONDS EVENT LOCK FENCE WHO", the time being
// CLOCK_REALTIME (one clock for every process on the machine):
//   GRANT  the acquire returned a guard: WHO believes it holds from here on
//   END    WHO stops believing: about to release (the release comes after)
//   LOST   the guard's stop_token was stopped: WHO learned its lease is lost
//   ERROR  an acquire failed (FENCE 0; the error follows, quoted)
// SIGTERM or SIGINT: every holder releases, then the program exits 0.
#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "pgmutex/asio.hpp"
#include "pgmutex/session.hpp"

namespace asio = boost::asio;
using namespace asio::experimental::awaitable_operators;
using namespace std::chrono_literals;

namespace {

struct Config {
  std::string who, dsn, table, prefix, log_path;
  int count = 0;
  int stale_s = 6;
};

// The log, shared by every holder of the process; one line per write.
class EventLog {
 public:
  explicit EventLog(const std::string& path) : out_(path, std::ios::app) {}
  [[nodiscard]] bool ok() const { return out_.good(); }
  void write(const char* event, const std::string& lock, pgmutex::Fence fence, const std::string& who,
             const std::string& detail = {}) {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
    std::lock_guard hold(mutex_);
    out_ << us << ' ' << event << ' ' << lock << ' ' << fence << ' ' << who;
    // One line per event: libpq's messages span lines.
    if (!detail.empty()) {
      std::string flat = detail;
      std::replace(flat.begin(), flat.end(), '\n', ' ');
      out_ << " \"" << flat << '"';
    }
    out_ << '\n' << std::flush;
  }

 private:
  std::mutex mutex_;
  std::ofstream out_;
};

pgmutex::Options lock_options(const Config& c, int i) {
  pgmutex::Options o{.lock_name = c.prefix + std::to_string(i), .instance_id = c.who + "-" + std::to_string(i),
                     .table = c.table};
  o.heartbeat_interval = 1s;
  o.stale_threshold = std::chrono::seconds(c.stale_s);
  o.alert_threshold = o.stale_threshold / 2;
  o.poll_interval = 200ms;
  return o;
}

std::shared_ptr<pgmutex::Session> open_session(const Config& c, const std::stop_token& stop) {
  pgmutex::SessionOptions options;
  options.heartbeat_tick = 100ms;
  while (!stop.stop_requested()) {
    auto session = pgmutex::Session::create(pgmutex::nothrow, c.dsn, options);
    if (session) return *session;
    std::cerr << c.who << ": no session yet: " << session.error().message() << '\n';
    std::this_thread::sleep_for(500ms);
  }
  return nullptr;
}

// One lock, held as long as the lease lasts, taken again after each loss.
void hold_forever(pgmutex::SessionMutex& mutex, const Config& c, EventLog& log, std::stop_token stop) {
  const std::string lock(mutex.lock_name());
  while (!stop.stop_requested()) {
    auto guard = mutex.acquire(pgmutex::nothrow, 30s, stop);
    if (!guard || !*guard) {
      if (!guard) log.write("ERROR", lock, 0, c.who, guard.error().message());
      std::this_thread::sleep_for(200ms);
      continue;
    }
    log.write("GRANT", lock, guard->fence(), c.who);
    std::mutex m;
    std::condition_variable_any woken;
    bool lost = false;
    {
      // Logged from the stop callback itself: the moment the holder learns.
      std::stop_callback on_lost(guard->stop_token(), [&] {
        log.write("LOST", lock, guard->fence(), c.who);
        std::lock_guard hold(m);
        lost = true;
        woken.notify_all();
      });
      std::unique_lock wait(m);
      woken.wait(wait, stop, [&] { return lost; });
      if (!lost) log.write("END", lock, guard->fence(), c.who);
    }
    (void)guard->release(pgmutex::nothrow);
  }
}

int run_session(const Config& c, EventLog& log, std::stop_source& stop) {
  auto session = open_session(c, stop.get_token());
  if (!session) return 0;
  std::vector<pgmutex::SessionMutex> mutexes;
  mutexes.reserve(c.count);
  for (int i = 0; i < c.count; ++i) mutexes.emplace_back(session->backend(), lock_options(c, i));
  std::vector<std::jthread> holders;
  for (auto& mutex : mutexes)
    holders.emplace_back([&, token = stop.get_token()] { hold_forever(mutex, c, log, token); });
  holders.clear();  // joins: each ends once stop is requested
  return 0;
}

// One AsioMutex's loop: acquire, work (a lost lease cuts it), release.
asio::awaitable<void> work_loop(pgmutex::AsioMutex& mutex, std::chrono::milliseconds work_time, const Config& c,
                                EventLog& log, const bool& stopping, int& holding) {
  const std::string lock(mutex.lock_name());
  asio::steady_timer pause(co_await asio::this_coro::executor);
  while (!stopping) {
    auto [error, guard] = co_await mutex.async_acquire(30s, asio::as_tuple(asio::use_awaitable));
    if (!guard) {
      if (error) log.write("ERROR", lock, 0, c.who, error.message());
      pause.expires_after(200ms);
      co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      continue;
    }
    log.write("GRANT", lock, guard.fence(), c.who);
    ++holding;
    asio::steady_timer work(co_await asio::this_coro::executor);
    work.expires_after(work_time);
    auto ended = co_await (guard.async_wait_lost(asio::use_awaitable) ||
                           work.async_wait(asio::as_tuple(asio::use_awaitable)));
    if (ended.index() == 0)
      log.write("LOST", lock, guard.fence(), c.who);
    else
      log.write("END", lock, guard.fence(), c.who);
    co_await guard.async_release(asio::as_tuple(asio::use_awaitable));
    --holding;
  }
}

int run_asio(const Config& c, EventLog& log, std::stop_source& stop) {
  auto session = open_session(c, stop.get_token());
  if (!session) return 0;
  asio::io_context io;
  std::vector<pgmutex::AsioMutex> mutexes;
  mutexes.reserve(c.count);
  for (int i = 0; i < c.count; ++i)
    mutexes.emplace_back(session->backend(), lock_options(c, i), pgmutex::SteadyClock{}, pgmutex::NoMetrics{},
                         pgmutex::AsioExecutor(io.get_executor()));
  bool stopping = false;
  int holding = 0;
  for (std::size_t i = 0; i < mutexes.size(); ++i)
    asio::co_spawn(io, work_loop(mutexes[i], i % 2 == 0 ? 300ms : 8000ms, c, log, stopping, holding), asio::detached);
  // The signal thread asks to stop; the loops take no new lock, and once
  // none holds one the process ends (acquires still waiting hold nothing:
  // their connection's end is all the cleanup they need).
  asio::steady_timer watch(io);
  std::function<void()> check = [&] {
    stopping = stop.stop_requested();
    if (stopping && holding == 0) std::_Exit(0);
    watch.expires_after(50ms);
    watch.async_wait([&](auto) { check(); });
  };
  check();
  io.run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if ((argc != 8 && argc != 9) || (std::strcmp(argv[1], "session") != 0 && std::strcmp(argv[1], "asio") != 0)) {
    std::cerr << "usage: ha_load session|asio WHO DSN TABLE PREFIX COUNT LOG [STALE_S]\n";
    return 64;
  }
  Config c{.who = argv[2], .dsn = argv[3], .table = argv[4], .prefix = argv[5], .log_path = argv[7]};
  c.count = std::atoi(argv[6]);
  if (c.count < 1 || c.count > 1000) {
    std::cerr << "ha_load: COUNT must be 1..1000, not '" << argv[6] << "'\n";
    return 64;
  }
  if (argc == 9) c.stale_s = std::atoi(argv[8]);
  if (c.stale_s < 3 || c.stale_s > 3600) {
    std::cerr << "ha_load: STALE_S must be 3..3600 seconds, not '" << argv[8] << "'\n";
    return 64;
  }
  EventLog log(c.log_path);
  if (!log.ok()) {
    std::cerr << "ha_load: cannot append to " << c.log_path << '\n';
    return 73;
  }
  // SIGTERM and SIGINT wait in a thread of their own, which asks everything to stop.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::stop_source stop;
  std::jthread on_signal([&] {
    int signal = 0;
    sigwait(&signals, &signal);
    stop.request_stop();
  });
  const int rc = std::strcmp(argv[1], "session") == 0 ? run_session(c, log, stop) : run_asio(c, log, stop);
  on_signal.detach();
  return rc;
}
