// What every Postgres waiter in a lock's queue reads and times alike, whether
// it blocks on its own connection (queue_waits.cpp) or waits on a
// pgmutex::Session's (queue_book.cpp): the release's NOTIFY payload, and the
// looks of a waiter that cannot LISTEN and of the runner-up. Private to the backend.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace pgmutex::postgres_detail {

// A waiter that cannot LISTEN looks this often, doubling from the first.
inline constexpr std::chrono::nanoseconds first_look = std::chrono::milliseconds(25);
inline constexpr std::chrono::nanoseconds longest_look = std::chrono::seconds(1);
// How long a pooled waiter's place lives without a look: three longest looks and more.
inline constexpr std::chrono::nanoseconds pooled_lease = std::chrono::seconds(5);
// The runner-up looks this long after the head's handoff deadline.
inline constexpr std::chrono::nanoseconds probe_slack = std::chrono::milliseconds(50);
// The net look every waiter makes once per its stale threshold comes at
// least this far apart: with short thresholds (seconds), a long line's
// looks would otherwise load the server for a wake-up that is rarely missed.
inline constexpr std::chrono::nanoseconds shortest_net = std::chrono::seconds(10);
// A LISTENing waiter whose place a lease keeps (no server pid bound it: a
// pooler in front) looks this often, so that the lease never lapses.
inline constexpr std::chrono::nanoseconds lease_look = pooled_lease / 2;

// The net look of a waiter that started waiting at `start`: once per its
// stale threshold, shortest_net apart at least. It catches a line whose near
// waiters all went (left, died with the holder's host, or took the lock
// themselves, which names nobody) and a near one that knows no holder.
inline std::chrono::steady_clock::time_point net_look(std::chrono::steady_clock::time_point start,
                                                      std::chrono::nanoseconds stale_threshold) {
  return start + std::max(stale_threshold, shortest_net);
}

// When a waiter looks without a wake-up: its net look, or sooner, the
// holder's stale deadline as its last try saw it (`holder_stale_in`) if it
// still watches that holder (a head or runner-up that heard of no other).
inline std::chrono::steady_clock::time_point unwoken_look(std::chrono::steady_clock::time_point start,
                                                          std::chrono::nanoseconds stale_threshold,
                                                          std::optional<std::chrono::nanoseconds> holder_stale_in,
                                                          bool watches_holder) {
  const auto net = net_look(start, stale_threshold);
  if (!watches_holder || !holder_stale_in) return net;
  return std::min(net, start + *holder_stale_in);
}

// 'o:<fence>:<head>:<runner-up>:<head's handoff ms>', a release's offer (or
// a queued try's), read into its two tickets and the head's handoff
// deadline; a payload of an earlier version has no deadline. A runner-up's
// dequeue sends the same form naming the next waiter, its last number the
// ms the offer may still stand: a runner-up waits as long after either.
struct Offer {
  std::int64_t head = 0;
  std::int64_t runner_up = 0;
  std::optional<std::chrono::milliseconds> head_handoff;
};
inline std::optional<Offer> offer_of(std::string_view payload) {
  if (!payload.starts_with("o:")) return std::nullopt;
  std::int64_t numbers[4] = {0, 0, 0, -1};
  std::size_t at = 2;
  for (auto& n : numbers) {
    const auto end = payload.find(':', at);
    const std::string_view part = payload.substr(at, end == std::string_view::npos ? payload.size() - at : end - at);
    if (std::from_chars(part.data(), part.data() + part.size(), n).ec != std::errc{}) return std::nullopt;
    if (end == std::string_view::npos) break;
    at = end + 1;
  }
  Offer offer{numbers[1], numbers[2], std::nullopt};
  if (numbers[3] >= 0) offer.head_handoff = std::chrono::milliseconds(numbers[3]);
  return offer;
}

// When the runner-up looks at a head that may let its offer lapse: after
// the head's handoff deadline (its own when the offer did not say: a
// payload of an earlier version), and a little more.
inline std::chrono::steady_clock::time_point probe_time(std::chrono::steady_clock::time_point now,
                                                        std::optional<std::chrono::milliseconds> head_handoff,
                                                        std::chrono::nanoseconds own_handoff) {
  return now + (head_handoff ? std::chrono::nanoseconds(*head_handoff) : own_handoff) + probe_slack;
}

}  // namespace pgmutex::postgres_detail
