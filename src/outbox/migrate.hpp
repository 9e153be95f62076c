#pragma once
#include <pqxx/pqxx>
#include <string>
#include <vector>

namespace outlive::outbox {

struct MigrationReport {
  std::vector<std::string> applied;  // applied by this run
  std::vector<std::string> skipped;  // recorded as applied before
};

// Applies the migrations of sql/ (embedded in the binary) in name order, each once, recording them
// in events.schema_migrations. Safe when several replicas run it at once: an advisory lock
// serialises the runs and the later ones find everything applied.
MigrationReport migrate(const std::string& database_url);

// Throws Error(not_migrated) with the SPEC 2.4 message when events.outbox does not exist.
void require_outbox(pqxx::connection_base& conn, const std::string& app_id);

}  // namespace outlive::outbox
