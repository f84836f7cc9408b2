// Why a holder's announce or vacate was refused (backend_election.hpp's
// term_refused): one text for every backend, so that a test against
// MemoryBackend and a user against Postgres read the same words.
#include <string>

#include "pgmutex/backend.hpp"

namespace pgmutex {

tl::unexpected<Error> term_refused(const HolderKey& key, std::string_view what, bool held, const LeaderRecord& record) {
  const std::string head = "lock '" + std::string(key.lock.lock_name) + "': cannot " + std::string(what) + ": ";
  const std::string fence = std::to_string(key.fence);
  if (!held)
    return fail(Errc::lock_not_held, head + "instance '" + std::string(key.instance_id) +
                                         "' no longer holds the lock under fence " + fence + " (its grant ended: " +
                                         // A vacate is keyed by the grant alone: a lapsed lease does not stop it.
                                         (what == "announce" ? "released, taken over, or past its lease)"
                                                             : "released or taken over)"));
  // Terms are fences, and fences only grow: a record above this grant's
  // fence means the fence sequence restarted below the election's terms.
  if (record.term > key.fence)
    return fail(Errc::lock_not_held,
                head + "the election table records term " + std::to_string(record.term) + " above this grant's fence " +
                    fence + " (the fence sequence was reset, e.g. the lock table and its sequence dropped and made "
                    "again while the election table stayed): run create_schema() (pgmutex schema) as the tables' "
                    "owner, which moves the sequence past the recorded terms");
  // Held, the term is the grant's (or, impossibly, below it) and not announced: vacated.
  return fail(Errc::lock_not_held, head + "term " + fence + " was vacated (a resign is under way)");
}

}  // namespace pgmutex
