#include "outbox/disconnects.hpp"

#include <pqxx/pqxx>

#include "common/error.hpp"

namespace outlive::outbox {

std::vector<RecentDisconnect> recent_disconnects(const std::string& database_url,
                                                 const std::vector<std::string>& app_ids,
                                                 std::chrono::seconds max_age) {
  pqxx::connection conn(database_url);
  pqxx::nontransaction tx(conn);
  if (!tx.exec("SELECT to_regclass('events.disconnects') IS NOT NULL")[0][0].as<bool>()) {
    throw Error(Errc::not_migrated,
                "events.disconnects does not exist: the database is older than this replica.\n"
                "Run the migrations first (outlive migrate).");
  }
  std::vector<RecentDisconnect> out;
  for (const auto& app : app_ids) {
    const auto rows = tx.exec_params(
        "SELECT viewer, floor(extract(epoch FROM disconnected_at) * 1000)::bigint"
        "  FROM events.disconnects"
        " WHERE app_id = $1 AND disconnected_at > now() - make_interval(secs => $2)",
        app, static_cast<double>(max_age.count()));
    for (const auto& r : rows) {
      out.push_back(RecentDisconnect{app, r[0].as<std::string>(), r[1].as<int64_t>()});
    }
  }
  return out;
}

}  // namespace outlive::outbox
