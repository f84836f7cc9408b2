// The acknowledged asynchronous heartbeats of one grant that are not yet
// known to be durable, and the proof that makes them so: the server's WAL
// positions (HeartbeatDurability). Pure state, kept under the grant book's
// lock. Not part of the API.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>

#include "pgmutex/backend.hpp"

namespace pgmutex::detail {

template <class TimePoint>
class UnconfirmedBeats {
 public:
  using time_point = TimePoint;

  // A restart may have lost them (a new server session), or a new grant began.
  void clear() noexcept {
    if (!beats_.empty()) beats_.clear();  // a deque's clear() is a call even when empty
  }

  // An asynchronous commit acknowledged at `answered` for a heartbeat sent
  // at `sent`, whose answer told `wal`. Its wal_before lies past the commit
  // of every earlier heartbeat whose answer came before `sent` (the server
  // had committed them when this one began), so it becomes their witness;
  // every witness at or below its wal_flushed is on disk. Returns the send
  // the lease counts from: the newest of `trusted` and the sends now known
  // durable. A backend that tells no WAL position (0) confirms nothing.
  time_point confirm(time_point sent, time_point answered, const HeartbeatDurability& wal, time_point trusted) {
    if (wal.wal_before != 0) {
      for (Beat& b : beats_)
        if (b.witness == 0 && b.answered <= sent) b.witness = wal.wal_before;
      std::erase_if(beats_, [&](const Beat& b) {
        if (b.witness == 0 || b.witness > wal.wal_flushed) return false;
        trusted = std::max(trusted, b.sent);
        return true;
      });
    }
    if (beats_.size() == max_beats) beats_.pop_front();  // spammed manual beats: keep the newest, stay conservative
    beats_.push_back(Beat{sent, answered, 0});
    return trusted;
  }

 private:
  struct Beat {
    time_point sent;
    time_point answered;
    std::uint64_t witness;  // a WAL position past its commit; 0: none yet
  };
  static constexpr std::size_t max_beats = 64;
  std::deque<Beat> beats_;
};

}  // namespace pgmutex::detail
