// The options' rules (pgmutex/options.hpp): each option checked, an invalid one
// named in its error, and the defaults filled in.
#include "pgmutex/options.hpp"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <random>
#include <type_traits>

#include <boost/hana/zip.hpp>

#include "pgmutex/backend.hpp"
#include "pgmutex/describe/options.hpp"
#include "pgmutex/describe/record.hpp"
#include "pgmutex/table_name.hpp"

namespace pgmutex {
namespace {

constexpr std::size_t max_name_chars = 64;  // VARCHAR(64)

std::string seconds_text(std::chrono::nanoseconds d) {
  std::array<char, 32> buffer{};
  std::snprintf(buffer.data(), buffer.size(), "%gs", std::chrono::duration<double>(d).count());
  return buffer.data();
}

}  // namespace

// Strict UTF-8, as Postgres checks it (pg_utf8_islegal): no overlong forms, no
// surrogates, nothing above U+10FFFF. A name that passes here is one the server takes.
std::optional<std::size_t> utf8_length(std::string_view text) noexcept {
  std::size_t count = 0;
  for (std::size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    std::size_t width = 0;
    unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
    if (lead < 0x80) width = 1;
    else if (lead >= 0xC2 && lead <= 0xDF) width = 2;
    else if (lead >= 0xE0 && lead <= 0xEF) {
      width = 3;
      if (lead == 0xE0) low = 0xA0;   // overlong below U+0800
      if (lead == 0xED) high = 0x9F;  // the surrogates U+D800..U+DFFF
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      width = 4;
      if (lead == 0xF0) low = 0x90;   // overlong below U+10000
      if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
    } else {
      return std::nullopt;
    }
    if (i + width > text.size()) return std::nullopt;
    for (std::size_t k = 1; k < width; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if (k == 1 ? (next < low || next > high) : (next & 0xC0) != 0x80) return std::nullopt;
    }
    i += width;
    ++count;
  }
  return count;
}

Result<void> validate_lock_name(std::string_view name, std::string_view option) {
  const std::string label(option);
  if (name.empty()) return fail(Errc::invalid_argument, label + " must not be empty");
  if (name.find('\0') != std::string_view::npos)
    return fail(Errc::invalid_argument, label + " must not contain a NUL byte");
  const auto length = utf8_length(name);
  if (!length) return fail(Errc::invalid_argument, label + " must be valid UTF-8");
  if (*length > max_name_chars)
    return fail(Errc::invalid_argument, label + " must be at most 64 characters, got " +
                                            std::to_string(*length));
  return {};
}

Result<void> validate_election_value(std::string_view lock_name, std::string_view value) {
  const std::string label = "the value for election '" + std::string(lock_name) + "'";
  if (value.size() > max_election_value_bytes)
    return fail(Errc::invalid_argument, label + " is " + std::to_string(value.size()) + " bytes; at most " +
                                            std::to_string(max_election_value_bytes) +
                                            ": it rides on a NOTIFY, whose payload Postgres limits to 8000 bytes");
  if (value.find('\0') != std::string_view::npos)
    return fail(Errc::invalid_argument, label + " must not contain a NUL byte");
  if (!utf8_length(value)) return fail(Errc::invalid_argument, label + " must be valid UTF-8");
  return {};
}

Result<void> validate_table_name(std::string_view table) {
  auto parsed = parse_table_name(table);
  if (!parsed) return tl::unexpected(std::move(parsed.error()));
  return {};
}

std::string default_instance_id() {
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0) host = {'h', 'o', 's', 't'};
  std::random_device entropy;
  std::array<char, 16> suffix{};
  std::snprintf(suffix.data(), suffix.size(), "-%08x", static_cast<unsigned>(entropy()));
  std::string hostname(host.data());
  // Keep the random suffix whole: cut the hostname (ASCII by RFC 1123) instead.
  const std::size_t room = max_name_chars - std::string_view(suffix.data()).size();
  if (hostname.size() > room) hostname.resize(room);
  return hostname + suffix.data();
}

namespace {

// An option's name as the description spells it: every message names options this way.
template <class T>
std::string name(T Options::*member) {
  return std::string(describe::field_of(member).name);
}

// The filled-in Options, member by member as the description lists them.
ValidOptions filled_in(Options&& o) {
  ValidOptions valid;
  boost::hana::for_each(
      boost::hana::zip(boost::hana::accessors<Options>(), boost::hana::accessors<ValidOptions>()), [&](auto pair) {
        auto& from = boost::hana::second(boost::hana::at_c<0>(pair))(o);
        auto& to = boost::hana::second(boost::hana::at_c<1>(pair))(valid);
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(from)>, std::remove_cvref_t<decltype(to)>>)
          to = std::move(from);
        else
          to = std::move(from).value();  // validate() filled in every default
      });
  return valid;
}

}  // namespace

Result<ValidOptions> validate(Options o, BackendTraits backend) {
  const std::string heartbeat_interval = name(&Options::heartbeat_interval);
  const std::string alert_threshold = name(&Options::alert_threshold);
  const std::string stale_threshold = name(&Options::stale_threshold);
  const std::string poll_interval = name(&Options::poll_interval);
  const std::string safety_margin = name(&Options::safety_margin);
  const std::string heartbeat_timeout = name(&Options::heartbeat_timeout);
  const std::string handoff_deadline = name(&Options::handoff_deadline);

  if (auto r = validate_lock_name(o.lock_name, name(&Options::lock_name)); !r) return tl::unexpected(r.error());
  if (o.instance_id.empty()) o.instance_id = default_instance_id();
  if (auto r = validate_lock_name(o.instance_id, name(&Options::instance_id)); !r) return tl::unexpected(r.error());
  if (auto r = validate_table_name(o.table); !r) return tl::unexpected(r.error());

  using std::chrono::nanoseconds;
  if (o.heartbeat_interval <= nanoseconds::zero())
    return fail(Errc::invalid_argument, heartbeat_interval + " must be > 0, got " + seconds_text(o.heartbeat_interval));
  if (o.poll_interval <= nanoseconds::zero())
    return fail(Errc::invalid_argument, poll_interval + " must be > 0, got " + seconds_text(o.poll_interval));
  if (!(o.heartbeat_interval < o.alert_threshold))
    return fail(Errc::invalid_argument, heartbeat_interval + " (" + seconds_text(o.heartbeat_interval) + ") must be < " +
                                            alert_threshold + " (" + seconds_text(o.alert_threshold) + ")");
  if (!(o.alert_threshold < o.stale_threshold))
    return fail(Errc::invalid_argument, alert_threshold + " (" + seconds_text(o.alert_threshold) + ") must be < " +
                                            stale_threshold + " (" + seconds_text(o.stale_threshold) + ")");
  const nanoseconds most_margin = (o.stale_threshold - o.heartbeat_interval) / 2;
  const nanoseconds margin = o.safety_margin.value_or(
      std::min(std::max(o.stale_threshold / 10, o.heartbeat_interval * 3 / 2), most_margin));
  if (margin <= nanoseconds::zero())
    return fail(Errc::invalid_argument, safety_margin + " must be > 0, got " + seconds_text(margin));
  if (!(o.stale_threshold - margin > o.heartbeat_interval))
    return fail(Errc::invalid_argument, stale_threshold + " - " + safety_margin + " (" +
                                            seconds_text(o.stale_threshold - margin) + ") must be > " +
                                            heartbeat_interval + " (" + seconds_text(o.heartbeat_interval) +
                                            "), or the holder's watchdog fires before its first heartbeat");
  const nanoseconds attempt = o.heartbeat_timeout.value_or(std::min<nanoseconds>(margin / 3, std::chrono::seconds(10)));
  if (attempt <= nanoseconds::zero())
    return fail(Errc::invalid_argument, heartbeat_timeout + " must be > 0, got " + seconds_text(attempt));
  // A heartbeat sent just before the lease ends may take a whole attempt to
  // fail; an acknowledged one that the server forgets (asynchronous commit)
  // leaves the row one interval older than the holder believes.
  const nanoseconds needed = attempt + (backend.heartbeat_commits_asynchronously ? o.heartbeat_interval : nanoseconds::zero());
  if (margin < needed) {
    std::string rule = safety_margin + " (" + seconds_text(margin) + ") must be >= " + heartbeat_timeout + " (" +
                       seconds_text(attempt) + ")";
    if (backend.heartbeat_commits_asynchronously)
      rule += " + " + heartbeat_interval + " (" + seconds_text(o.heartbeat_interval) +
              ", since heartbeats commit asynchronously) = " + seconds_text(needed);
    return fail(Errc::invalid_argument, rule + ": one heartbeat attempt must end before anyone may reclaim");
  }
  const nanoseconds handoff = o.handoff_deadline.value_or(std::min<nanoseconds>(std::chrono::seconds(2), o.stale_threshold - margin));
  if (handoff <= nanoseconds::zero())
    return fail(Errc::invalid_argument, handoff_deadline + " must be > 0, got " + seconds_text(handoff));
  if (handoff > o.stale_threshold - margin)
    return fail(Errc::invalid_argument, handoff_deadline + " (" + seconds_text(handoff) + ") must be <= " + stale_threshold +
                                            " - " + safety_margin + " (" + seconds_text(o.stale_threshold - margin) +
                                            "): an offer outliving a lease is never needed");
  o.safety_margin = margin;
  o.heartbeat_timeout = attempt;
  o.handoff_deadline = handoff;
  return filled_in(std::move(o));
}

namespace detail {

Result<Options> options_for_lock(const ValidOptions& options, std::string_view lock_name) {
  if (auto valid = validate_lock_name(lock_name); !valid) {
    // The name as given, cut short and with control bytes shown as '?', so the message stays one readable line.
    std::string shown;
    for (char c : lock_name.substr(0, 80)) shown += static_cast<unsigned char>(c) < 0x20 ? '?' : c;
    if (lock_name.size() > 80) shown += "...";
    return fail(Errc::invalid_argument, "singleton lock name \"" + shown + "\" refused: " + valid.error().detail);
  }
  Options other;
  other.lock_name = std::string(lock_name);
  other.instance_id = options.instance_id;
  other.table = options.table;
  other.heartbeat_interval = options.heartbeat_interval;
  other.alert_threshold = options.alert_threshold;
  other.stale_threshold = options.stale_threshold;
  other.poll_interval = options.poll_interval;
  other.safety_margin = options.safety_margin;
  other.heartbeat_timeout = options.heartbeat_timeout;
  other.handoff_deadline = options.handoff_deadline;
  return other;
}

}  // namespace detail
}  // namespace pgmutex
