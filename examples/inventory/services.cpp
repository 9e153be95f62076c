#include "services.hpp"

#include <memory>
#include <nlohmann/json.hpp>

namespace inventory {

std::optional<std::string> find_warehouse(pqxx::transaction_base& tx, const std::string& public_id) {
  auto r = tx.exec_params("SELECT id::text FROM inventory.warehouses WHERE public_id = $1", public_id);
  if (r.empty()) return std::nullopt;
  return r[0][0].as<std::string>();
}

std::vector<std::string> members_among(pqxx::transaction_base& tx, const std::string& warehouse_id,
                                       const std::vector<std::string>& subjects) {
  if (subjects.empty()) return {};
  auto r = tx.exec_params(
      "SELECT subject FROM inventory.members WHERE warehouse_id = $1::uuid"
      " AND subject IN (SELECT jsonb_array_elements_text($2::jsonb))",
      warehouse_id, nlohmann::json(subjects).dump());
  std::vector<std::string> members;
  for (const auto& row : r) members.push_back(row[0].as<std::string>());
  return members;
}

namespace {

// outlive calls the functions on its two channel threads, one call at a time per thread: a
// connection per thread needs no pool and no lock. A broken one is replaced at the next call (the
// failed call closes its socket with 1011 and the tab resumes from its cursor).
pqxx::connection& thread_connection(const std::string& url) {
  thread_local std::unique_ptr<pqxx::connection> conn;
  if (!conn || !conn->is_open()) conn = std::make_unique<pqxx::connection>(url);
  return *conn;
}

}  // namespace

outlive::CodeChannel warehouse_code_channel(std::string database_url) {
  outlive::CodeChannel channel;
  channel.app = "inventory";
  channel.name = "warehouse_code";
  channel.scope = {{"type", "object"},
                   {"properties", {{"warehouse", {{"type", "string"}}}}},
                   {"required", {"warehouse"}},
                   {"additionalProperties", false}};
  channel.keys = outlive::blocking_keys(
      [url = database_url](const nlohmann::json& scope, const nlohmann::json&) -> outlive::KeysResult {
        pqxx::connection& conn = thread_connection(url);
        pqxx::read_transaction tx(conn);
        const auto id = find_warehouse(tx, scope["warehouse"].get<std::string>());
        if (!id) return std::nullopt;  // the tab receives not_found
        return std::vector<std::string>{*id};
      });
  channel.authorize = outlive::blocking_authorize(
      [url = std::move(database_url)](const std::string& key, const nlohmann::json& viewers) {
        std::vector<std::string> subjects;
        for (const auto& v : viewers) subjects.push_back(v.value("accessSubject", ""));
        pqxx::connection& conn = thread_connection(url);
        pqxx::read_transaction tx(conn);
        const auto members = members_among(tx, key, subjects);
        // A batch may hold several viewers of one subject (several tabs): each member's viewer id.
        outlive::AllowedViewers allowed;
        for (const auto& v : viewers) {
          for (const auto& m : members) {
            if (v.value("accessSubject", "") == m) {
              allowed.push_back(v["id"].get<std::string>());
              break;
            }
          }
        }
        return allowed;
      });
  return channel;
}

}  // namespace inventory
