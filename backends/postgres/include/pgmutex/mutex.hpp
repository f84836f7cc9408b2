// pgmutex::Mutex: the everyday mutex, a BasicMutex over PostgresBackend with
// the default clock, metrics and executor. Its code is compiled once, in the
// pgmutex_postgres library, so including this header costs little.
#pragma once

#include "pgmutex/basic_mutex.hpp"
#include "pgmutex/postgres_backend.hpp"

namespace pgmutex {

extern template class BasicMutex<PostgresBackend>;

using Mutex = BasicMutex<PostgresBackend>;

}  // namespace pgmutex
