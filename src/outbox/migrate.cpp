#include "outbox/migrate.hpp"

#include <pqxx/pqxx>

#include "common/error.hpp"
#include "common/log.hpp"
#include "outbox/pg_error.hpp"

namespace outlive::outbox {
namespace sql {
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_files();
}

MigrationReport migrate(const std::string& database_url) {
  MigrationReport report;
  try {
    pqxx::connection conn(database_url);
    pqxx::work tx(conn);
    // Serialise concurrent runs before touching the catalog: CREATE SCHEMA IF NOT EXISTS alone
    // still races on the catalog's unique index.
    tx.exec("SELECT pg_advisory_xact_lock(7301, 0)");
    tx.exec("CREATE SCHEMA IF NOT EXISTS events");
    tx.exec(
        "CREATE TABLE IF NOT EXISTS events.schema_migrations ("
        " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())");
    for (const auto& [name, body] : sql::embedded_files()) {
      const std::string n(name);
      if (!tx.exec_params("SELECT 1 FROM events.schema_migrations WHERE name = $1", n).empty()) {
        report.skipped.push_back(n);
        continue;
      }
      tx.exec(std::string(body));
      tx.exec_params0("INSERT INTO events.schema_migrations (name) VALUES ($1)", n);
      report.applied.push_back(n);
    }
    tx.commit();
  } catch (...) {
    rethrow_as_error("migrate");
  }
  return report;
}

void require_outbox(pqxx::connection_base& conn, const std::string& app_id) {
  pqxx::nontransaction tx(conn);
  const auto r = tx.exec("SELECT to_regclass('events.outbox') IS NOT NULL");
  if (!r[0][0].as<bool>()) {
    throw Error(Errc::not_migrated,
                "\"" + app_id +
                    "\" writes live updates to events.outbox, which does not exist.\n"
                    "Run the migrations first (outlive migrate): they create the outbox.");
  }
}

void require_outboxes(
    const std::string& database_url, const std::vector<std::string>& app_ids,
    const std::function<void(const std::string& app_id, const std::exception& e)>& on_failure) {
  pqxx::connection conn(database_url);
  for (const auto& id : app_ids) {
    if (!on_failure) {
      require_outbox(conn, id);
      continue;
    }
    try {
      require_outbox(conn, id);
    } catch (const std::exception& e) {
      on_failure(id, e);
    }
  }
}

}  // namespace outlive::outbox
