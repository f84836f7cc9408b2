// pgmutex run's safety margin before --stale-threshold runs out, and its checks
// (safety_margin.hpp).
#include "safety_margin.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <ratio>

namespace pgmutex::cli {
namespace {

using std::chrono::nanoseconds;

std::string seconds(nanoseconds d) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f s", std::chrono::duration<double>(d).count());
  return buffer;
}

struct Need {
  nanoseconds attempt;
  nanoseconds margin;
};

// What covering `grace` takes: attempt = margin / 3 where 1..10 s allows.
Need need_for(nanoseconds grace, nanoseconds interval) {
  const nanoseconds attempt = std::clamp<nanoseconds>((grace + interval) / 2, std::chrono::seconds(1), std::chrono::seconds(10));
  return {attempt, grace + attempt + interval};
}

// Options whose margin covers `grace`, if the thresholds leave room for it.
std::optional<Options> covering(Options options, nanoseconds grace) {
  const Need need = need_for(grace, options.heartbeat_interval);
  options.heartbeat_timeout = need.attempt;
  Options library_defaults = options;
  library_defaults.safety_margin.reset();
  library_defaults.heartbeat_timeout.reset();
  if (auto defaults = validate(library_defaults, run_backend_traits))
    options.safety_margin = std::max(need.margin, defaults->safety_margin);  // never less than the library's own
  else
    options.safety_margin = need.margin;
  if (!validate(options, run_backend_traits)) return std::nullopt;
  return options;
}

// The longest grace these thresholds can cover (0 if none), by bisection:
// the need grows with the grace.
std::optional<nanoseconds> longest_grace(const Options& options, nanoseconds grace) {
  if (!covering(options, nanoseconds::zero())) return std::nullopt;
  nanoseconds fits = nanoseconds::zero();
  nanoseconds too_long = grace;
  while (too_long - fits > std::chrono::milliseconds(50)) {
    const nanoseconds middle = fits + (too_long - fits) / 2;
    (covering(options, middle) ? fits : too_long) = middle;
  }
  return fits;
}

// Where the grace cannot be covered: the library's defaults, unless their cap
// on the margin ((stale - interval) / 2) leaves no room for an attempt and an
// interval; then the least margin that has room: 1.5 intervals, a third of it
// for the attempt.
Options uncovered(Options options) {
  if (validate(options, run_backend_traits)) return options;
  Options least = options;
  least.safety_margin = options.heartbeat_interval * 3 / 2;
  least.heartbeat_timeout = *least.safety_margin / 3;
  return validate(least, run_backend_traits) ? least : options;
}

}  // namespace

RunMargin plan_margin(Options options, nanoseconds grace) {
  if (auto covered = covering(options, grace)) return {*covered, {}};
  options = uncovered(std::move(options));
  const auto chosen = validate(options, run_backend_traits);
  if (!chosen) return {std::move(options), {}};  // check_usage reports the broken rule
  const nanoseconds interval = options.heartbeat_interval;
  const nanoseconds needed = grace + chosen->heartbeat_timeout + interval;
  if (chosen->safety_margin >= needed) return {std::move(options), {}};  // a short grace fits a short attempt

  // What covering the grace would take (need_for), and with these thresholds
  // the longest grace either way covers.
  const Need need = need_for(grace, interval);
  nanoseconds longest = chosen->safety_margin - chosen->heartbeat_timeout - interval;
  if (const auto by_attempt = longest_grace(options, grace)) longest = std::max(longest, *by_attempt);
  std::string line = "the safety margin these thresholds leave (" + seconds(chosen->safety_margin) +
                     ") cannot cover --grace (" + seconds(grace) + ") + one heartbeat attempt (" +
                     seconds(chosen->heartbeat_timeout) + ") + --heartbeat-interval (" + seconds(interval) +
                     ", heartbeats commit asynchronously) = " + seconds(needed) +
                     ": if the lock is lost, the command may still run when another instance may take the lock over; ";
  if (longest > nanoseconds::zero())
    line += "lower --grace to " + seconds(std::chrono::floor<std::chrono::duration<long long, std::deci>>(longest)) +
            " or less, or ";
  line += "raise --stale-threshold above " + seconds(need.margin + interval) + " (for a safety margin of " +
          seconds(need.margin) + ": --grace + a " + seconds(need.attempt) +
          " heartbeat attempt + --heartbeat-interval)";
  return {std::move(options), std::move(line)};
}

nanoseconds guard_lead(const ValidOptions& options, nanoseconds grace) {
  // What the margin covers beyond one attempt and one interval...
  const nanoseconds covered = options.safety_margin - options.heartbeat_timeout - options.heartbeat_interval;
  // ...and what the lease leaves beyond the confirmation's lag (one interval)
  // and the wait for the next renewal (one interval and one attempt): a
  // healthy holder's renewal always comes before the guard acts.
  const nanoseconds spare = options.lease() - 2 * options.heartbeat_interval - options.heartbeat_timeout;
  return std::clamp(std::min(covered, spare), nanoseconds::zero(), std::max(grace, nanoseconds::zero()));
}

}  // namespace pgmutex::cli
