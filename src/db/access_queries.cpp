#include "db/access_queries.hpp"

#include <pqxx/pqxx>

#include "db/connection.hpp"
#include "db/typed_query.hpp"

namespace outlive::db {
namespace {

Column first_column(const pqxx::result& rows) {
  Column out;
  out.reserve(rows.size());
  for (const auto& r : rows) {
    if (r[0].is_null()) {
      out.emplace_back(std::nullopt);
    } else {
      out.emplace_back(r[0].as<std::string>());
    }
  }
  return out;
}

}  // namespace

Column AccessQueries::keys(Connection& conn, const std::string& sql, const std::string& scope_json,
                           const std::string& viewer_json) {
  return first_column(exec_typed(conn.raw(), sql, {"jsonb", "jsonb"}, {scope_json, viewer_json}));
}

std::vector<Column> AccessQueries::keys(Connection& conn, const std::string& sql,
                                        const std::vector<std::string>& scope_jsons,
                                        const std::string& viewer_json) {
  std::vector<Column> out;
  if (scope_jsons.size() == 1) {
    out.push_back(keys(conn, sql, scope_jsons[0], viewer_json));
    return out;
  }
  std::vector<std::vector<std::string>> rows;
  rows.reserve(scope_jsons.size());
  for (const auto& scope : scope_jsons) rows.push_back({scope, viewer_json});
  const auto results = exec_typed_batch(conn.raw(), sql, {"jsonb", "jsonb"}, rows);
  out.reserve(results.size());
  for (const auto& r : results) out.push_back(first_column(r));
  return out;
}

Column AccessQueries::authorize(Connection& conn, const std::string& sql, const std::string& key,
                                const std::string& viewers_json) {
  return first_column(exec_typed(conn.raw(), sql, {"text", "jsonb"}, {key, viewers_json}));
}

}  // namespace outlive::db
