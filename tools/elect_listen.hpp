// pgmutex elect --listen: follow a lock's election without campaigning.
#pragma once

#include <string>

#include "arguments.hpp"

namespace pgmutex::cli {

struct ListenArgs {
  ConnectionArgs connection;
  std::string lock;
  std::string instance_id;
  bool json = false;
};

// Prints the current leader, then every change, one line each (JSON objects
// with --json), until SIGINT or SIGTERM: then exits 0.
int listen_for_leaders(const ListenArgs& args);

}  // namespace pgmutex::cli
