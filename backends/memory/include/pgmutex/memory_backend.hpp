// MemoryBackend: the lock table in process memory, for deterministic tests of
// pgmutex and of code that uses it. A MemoryServer plays the database (rows,
// fence sequence, a virtual server clock, injected faults); each MemoryBackend
// is one instance's connection to it.
//
// The public entry: it includes the parts, pgmutex/memory/server.hpp
// (MemoryServer) and pgmutex/memory/backend.hpp (MemoryBackend).
#pragma once

#include "pgmutex/memory/backend.hpp"
#include "pgmutex/memory/server.hpp"
