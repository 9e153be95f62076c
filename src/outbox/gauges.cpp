#include "outbox/gauges.hpp"

#include <pqxx/pqxx>

#include "db/connection.hpp"

namespace outlive::outbox {

std::map<std::string, Backlog> backlog_by_app(db::Connection& conn) {
  std::map<std::string, Backlog> seen;
  for (const auto& row : pqxx::nontransaction(conn.raw())
                             .exec("SELECT app_id, count(*), coalesce(extract(epoch FROM "
                                   "now() - min(created_at)), 0)::float8 FROM events.outbox "
                                   "GROUP BY app_id")) {
    seen[row[0].c_str()] = Backlog{row[1].as<int64_t>(), row[2].as<double>()};
  }
  return seen;
}

}  // namespace outlive::outbox
