// The election's operations (BackendKeepsElections) on PostgresBackend: who
// leads, in one read, and the holder's announce and vacate, each one
// statement of election_sql.cpp keyed by the holder's grant.
#include <cstdlib>

#include "backend_impl.hpp"
#include "statement_values.hpp"

namespace pgmutex {

using namespace postgres_detail;

namespace {

std::int64_t int64_at(const Rows& rows, std::size_t c, std::size_t r = 0) {
  return std::strtoll(rows.text(r, c).c_str(), nullptr, 10);
}
double double_at(const Rows& rows, std::size_t c, std::size_t r = 0) {
  return std::strtod(rows.text(r, c).c_str(), nullptr);
}

// The election row's columns from `c` on (election_sql.cpp's record_columns)
// in row `r`; NULL: never announced.
void read_record(const Rows& rows, std::size_t c, LeaderRecord& out, std::size_t r = 0) {
  if (rows.is_null(r, c)) return;
  out.term = int64_at(rows, c, r);
  out.change = int64_at(rows, c + 1, r);
  out.announced = rows.text(r, c + 2) == "t";
  out.value = rows.text(r, c + 3);
  out.instance_id = rows.text(r, c + 4);
  out.host = rows.text(r, c + 5);
  out.since_us = int64_at(rows, c + 6, r);
}

// The lock row's columns after the election row's, from `c` on (election_sql.cpp's lock_row_columns).
void read_lock_row(const Rows& rows, std::size_t c, LeaderRecord& out, std::size_t r = 0) {
  out.lock_fence = int64_at(rows, c, r);
  out.seconds_since_heartbeat = double_at(rows, c + 1, r);
  out.lock_live = rows.text(r, c + 2) == "t";
  out.stale_after_s = double_at(rows, c + 3, r);
}

}  // namespace

Result<LeaderRecord> PostgresBackend::leader(LockRef lock, std::chrono::nanoseconds stale_threshold) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<LeaderRecord>(
      lock.table, "read the leader of " + lock_context(lock), Effect::read, {},
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<LeaderRecord> {
        auto rows = session.run(st.leader, {std::string(lock.lock_name), seconds_param(stale_threshold)}, bound);
        if (!rows) return tl::unexpected(std::move(rows.error()));
        LeaderRecord out;
        read_record(*rows, 0, out);
        read_lock_row(*rows, 7, out);
        return out;
      });
}

Result<std::vector<ElectionRow>> PostgresBackend::list_elections(std::string_view table,
                                                                 std::chrono::nanoseconds stale_threshold) noexcept {
  if (!impl_) return moved_from();
  return impl_->on_table<std::vector<ElectionRow>>(
      table, "list the elections of '" + std::string(table) + "'", Effect::read, {},
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<std::vector<ElectionRow>> {
        auto rows = session.run(st.list_elections, {seconds_param(stale_threshold)}, bound);
        if (!rows) return tl::unexpected(std::move(rows.error()));
        std::vector<ElectionRow> out(rows->size());
        for (std::size_t r = 0; r < rows->size(); ++r) {
          out[r].lock_name = rows->text(r, 0);
          read_record(*rows, 1, out[r].record, r);
          read_lock_row(*rows, 8, out[r].record, r);
        }
        return out;
      });
}

namespace {

// One keyed statement of the holder (announce or vacate): its parameters are
// a heartbeat's key, the lock timeout, then `extra`, then the lock hash.
// Sets `held`: whether the key held the lock. Returns the election row as it is now.
template <class Impl>  // PostgresBackend::Impl, deduced (it is private)
Result<LeaderRecord> keyed_statement(Impl& impl, const HolderKey& key, const std::string& what,
                                     Statement TableStatements::*statement, const std::vector<std::string>& extra,
                                     bool& held) {
  return impl.template on_table<LeaderRecord>(
      key.lock.table, what + " " + lock_context(key.lock), Effect::idempotent_write, key.timeout,
      [&](Session& session, const Bound& bound, const TableStatements& st) -> Outcome<LeaderRecord> {
        std::vector<std::string> params{std::string(key.lock.lock_name), std::string(key.instance_id),
                                        std::to_string(key.fence), token_param(key.token), bound.lock_timeout_param()};
        params.insert(params.end(), extra.begin(), extra.end());
        params.push_back(lock_hash(key.lock.lock_name));
        auto rows = session.run(st.*statement, params, bound);
        if (!rows) return tl::unexpected(std::move(rows.error()));
        LeaderRecord out;
        held = !rows->empty() && rows->text(0, 0) == "t";
        if (!rows->empty()) read_record(*rows, 1, out);
        return out;
      });
}

}  // namespace

Result<LeaderRecord> PostgresBackend::announce(const HolderKey& key, std::string_view value) noexcept {
  if (!impl_) return moved_from();
  if (auto valid = validate_election_value(key.lock.lock_name, value); !valid) return tl::unexpected(valid.error());
  bool held = false;
  auto record = keyed_statement(*impl_, key, "announce the leader of", &TableStatements::announce,
                                {std::string(value)}, held);
  if (!record) return record;
  // Held, but its term vacated already (a resign under way), or a higher
  // term recorded (a fence sequence reset): refused all the same.
  if (!held || record->term != key.fence || !record->announced) return term_refused(key, "announce", held, *record);
  record->lock_fence = key.fence;
  record->lock_live = true;
  return record;
}

Result<LeaderRecord> PostgresBackend::vacate(const HolderKey& key) noexcept {
  if (!impl_) return moved_from();
  bool held = false;
  auto record = keyed_statement(*impl_, key, "vacate the leadership of", &TableStatements::vacate, {}, held);
  if (!record) return record;
  // Vacated now, or by an earlier try whose reply was lost, or never announced: done.
  if (!held) return term_refused(key, "vacate", held, *record);
  record->lock_fence = key.fence;
  record->lock_live = true;
  return record;
}

}  // namespace pgmutex
