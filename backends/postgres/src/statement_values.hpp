// The values in the backend's statements, both ways: parameters written as
// the text Postgres parses (arrays, seconds, grant tokens), and result rows
// read back into a LockRow, an AcquireResult, a batch's answers and a
// heartbeat's durability. Private to the backend.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "pgmutex/backend.hpp"
#include "statement_outcome.hpp"

namespace pgmutex::postgres_detail {

// Postgres array literal {"a","b"} for text[] parameters.
std::string text_array(const std::vector<std::string_view>& items);
std::string seconds_param(std::chrono::nanoseconds d);
// The token is stored as BIGINT: the same 64 bits, read as signed.
std::string token_param(GrantToken token);

// A row read with sql.cpp's row_columns.
LockRow row_from(const Rows& rows, std::size_t r);
// Row r of the queue's listing (TableStatements::list_queue).
QueuedWaiterRow waiter_from(const Rows& rows, std::size_t r);

// One try of an acquire, read as the statement returns it: ins fence, upd
// fence, then the row it saw. `raced`: it lost to a holder that is gone or
// unknown, and may be tried again with a fresh snapshot.
AcquireResult read_acquire(const Rows& rows, bool& raced);
// A queued try's answer (sql.hpp, acquire_queued).
AcquireResult read_queued_acquire(const Rows& rows);
// A lean confirm's answer (sql.hpp, confirm_offer): acquired with the fence,
// or nothing (the offer is not ours any more).
AcquireResult read_confirmed_offer(const Rows& rows);

// heartbeat_many's answer for `keys` distinct keys: the rows name the
// (1-based) positions of the keys whose rows it found.
std::vector<bool> keys_beaten(const Rows& rows, std::size_t keys);

// How a heartbeat's rows say it was committed. `synchronous`: it waited for
// the WAL flush. Otherwise its rows carry wal_before and wal_flushed from
// column `first` on (one value per statement, repeated per row): the
// largest wal_before and the smallest wal_flushed are kept, which can only
// delay a confirmation. No row: nothing told (0), nothing confirmed.
HeartbeatDurability durability_of(const Rows& rows, bool synchronous, std::size_t first);

}  // namespace pgmutex::postgres_detail
