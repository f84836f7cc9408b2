// pgmutex::Mutex: the everyday mutex, a BasicMutex over PostgresBackend with
// the default clock, metrics and executor; pgmutex::Election likewise, an
// election on one (pgmutex/election.hpp), and pgmutex::Observer, following
// an election without campaigning (pgmutex/observer.hpp). Their code is compiled once, in the
// pgmutex_postgres library, so including this header costs little.
#pragma once

#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/election.hpp"
#include "pgmutex/observer.hpp"
#include "pgmutex/postgres_backend.hpp"

namespace pgmutex {

extern template class BasicMutex<PostgresBackend>;

using Mutex = BasicMutex<PostgresBackend>;

extern template class BasicElection<PostgresBackend>;

using Election = BasicElection<PostgresBackend>;

extern template class BasicObserver<PostgresBackend>;

using Observer = BasicObserver<PostgresBackend>;

}  // namespace pgmutex
