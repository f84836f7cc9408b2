// The explicit instantiation that pgmutex/session.hpp declares extern.
#include "pgmutex/session.hpp"

namespace pgmutex {

template class BasicMutex<SessionBackend>;
template class BasicElection<SessionBackend>;
template class BasicObserver<SessionBackend>;

}  // namespace pgmutex
