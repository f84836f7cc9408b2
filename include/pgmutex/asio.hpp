// pgmutex on Boost.Asio: AsioMutex, a mutex on a Session whose handlers run
// on the user's event loop, and the async forms of its operations
// (async_create_schema, async_try_acquire, async_acquire, async_singleton,
// and the guard's async_release, async_heartbeat, async_wait_lost), each
// taking a completion token; AsioElection and AsioObserver likewise. Construct it with its loop:
//   AsioMutex m(session->backend(), options, {}, {}, AsioExecutor(io.get_executor()));
// The only public header, with pgmutex/asio/, that includes Boost.Asio.
#pragma once

#include "pgmutex/asio/executor.hpp"
#include "pgmutex/session.hpp"

namespace pgmutex {

using AsioMutex = BasicMutex<SessionBackend, SteadyClock, NoMetrics, AsioExecutor>;
// Leader election on the loop (pgmutex/election.hpp; asio/election_ops.hpp):
// async_campaign, async_leader, and the leadership's async_proclaim and
// async_resign; an observer's async_next and async_observe.
using AsioElection = BasicElection<SessionBackend, SteadyClock, NoMetrics, AsioExecutor>;
using AsioObserver = BasicObserver<SessionBackend, SteadyClock, NoMetrics, AsioExecutor>;

}  // namespace pgmutex
