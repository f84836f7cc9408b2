// pgmutex schema: create the lock table, or upgrade one made without a fence column.
#include <iostream>
#include <memory>

#include "arguments.hpp"
#include "commands.hpp"
#include "connection.hpp"
#include "exit_codes.hpp"

namespace pgmutex::cli {
namespace {

int execute(const ConnectionArgs& args) {
  PostgresBackend backend = connect_backend(args);
  if (auto created = backend.create_schema(args.table); !created) exit_with(created.error(), "schema", args);
  std::cout << "table " << args.table << " is ready (created or upgraded if needed)\n";
  return exit_code::ok;
}

}  // namespace

CommandRunner add_schema_command(CLI::App& app) {
  auto args = std::make_shared<ConnectionArgs>();
  CLI::App* schema = app.add_subcommand("schema", "Create the lock table, or upgrade it in place (idempotent)");
  add_connection_options(*schema, *args);
  schema->footer(R"(Examples:
  pgmutex schema
  pgmutex schema --dsn 'postgresql://admin@db/app' --table jobs.mutex_lock)");
  return [args] { return execute(*args); };
}

}  // namespace pgmutex::cli
