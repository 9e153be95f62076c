#pragma once
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace pqxx {
class connection_base;
}

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

// require_outbox() for each of `app_ids` on one connection of its own to `database_url`. When
// connecting fails, that throws. An app's failure goes to `on_failure` and the next app is checked;
// without `on_failure` the first one throws (the replica's start).
void require_outboxes(
    const std::string& database_url, const std::vector<std::string>& app_ids,
    const std::function<void(const std::string& app_id, const std::exception& e)>& on_failure = {});

}  // namespace outlive::outbox
