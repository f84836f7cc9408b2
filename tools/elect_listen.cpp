// pgmutex elect --listen [--json]: the current leader of a lock, then every
// change, one line each, until SIGINT or SIGTERM (issue 18). It never
// campaigns: a pgmutex::Observer on its own connection, woken by NOTIFY.
#include "elect_listen.hpp"

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "connection.hpp"
#include "exit_codes.hpp"
#include "interrupt_watch.hpp"
#include "pgmutex/mutex.hpp"
#include "signals.hpp"
#include "status_format.hpp"
#include "terminal_text.hpp"

namespace pgmutex::cli {
namespace {

const char* event_name(LeaderEvent e) {
  switch (e) {
    case LeaderEvent::current: return "current";
    case LeaderEvent::elected: return "elected";
    case LeaderEvent::proclaimed: return "proclaimed";
    case LeaderEvent::vacated: return "vacated";
    case LeaderEvent::expired: return "expired";
  }
  return "unknown";
}

// {"lock", "event", "term", "change", "value", "instance", "host", "since", "gap", "missed"}:
// value, instance, host and since are null while nobody leads; missed while unknown or no gap.
std::string json_line(const std::string& lock, const LeaderChange& c) {
  nlohmann::ordered_json j;
  j["lock"] = lock;
  j["event"] = event_name(c.event);
  j["term"] = c.term;
  j["change"] = c.change;
  j["value"] = c.leader ? nlohmann::ordered_json(c.leader->value) : nlohmann::ordered_json(nullptr);
  j["instance"] = c.leader ? nlohmann::ordered_json(c.leader->instance_id) : nlohmann::ordered_json(nullptr);
  j["host"] = c.leader && !c.leader->host.empty() ? nlohmann::ordered_json(c.leader->host)
                                                   : nlohmann::ordered_json(nullptr);
  j["since"] = c.leader ? nlohmann::ordered_json(iso8601(c.leader->since)) : nlohmann::ordered_json(nullptr);
  j["gap"] = c.gap;
  j["missed"] = c.missed ? nlohmann::ordered_json(*c.missed) : nlohmann::ordered_json(nullptr);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// "term 7: 10.0.0.7:5432 (instance web-1, elected)" or "term 7: nobody leads (vacated)".
std::string text_line(const LeaderChange& c) {
  std::string line = "term " + std::to_string(c.term) + ": ";
  if (c.leader)
    line += "'" + shown(c.leader->value) + "' (instance " + shown(c.leader->instance_id) + ", " + event_name(c.event) + ")";
  else
    line += std::string("nobody leads (") + (c.event == LeaderEvent::current ? "now" : event_name(c.event)) + ")";
  if (c.gap)
    line += c.missed ? ", after " + std::to_string(*c.missed) + " change(s) missed" : ", after changes missed";
  return line;
}

}  // namespace

int listen_for_leaders(const ListenArgs& args) {
  block_supervised_signals();
  SignalReader signals;
  InterruptWatch interrupts(signals);
  Options options;
  options.lock_name = args.lock;
  if (!args.connection.table.empty()) options.table = args.connection.table;
  if (!args.instance_id.empty()) options.instance_id = args.instance_id;
  Observer observer(connect_backend(args.connection), options);
  interrupts.start_waiting();
  auto watched = observer.observe(
      nothrow,
      [&](const LeaderChange& c) {
        const std::string line = args.json ? json_line(args.lock, c) : text_line(c);
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      },
      interrupts.stop_token());
  interrupts.finish();
  if (!watched) exit_with(watched.error(), "elect --listen", args.connection);
  return 0;  // interrupted: the end of listening, not a failure
}

}  // namespace pgmutex::cli
