// The explicit instantiation that pgmutex/mutex.hpp declares extern.
#include "pgmutex/mutex.hpp"

namespace pgmutex {

template class BasicMutex<PostgresBackend>;
template class BasicElection<PostgresBackend>;
template class BasicObserver<PostgresBackend>;

}  // namespace pgmutex
