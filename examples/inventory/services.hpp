#pragma once
// The inventory app's own services: who may read a warehouse. The app's HTTP routes (main.cpp)
// ask them before serving a snapshot, and the C++ channel `warehouse_code` (replica.cpp) asks the
// same functions from outlive's keys() and authorize(): one membership rule, in C++, beside the
// SQL channel `warehouse` of outlive.json that states it as a query.
#include <optional>
#include <outlive/channel.hpp>
#include <pqxx/pqxx>
#include <string>
#include <vector>

namespace inventory {

// The warehouse's id (uuid text) for its public id ("north"), or nullopt when there is none.
std::optional<std::string> find_warehouse(pqxx::transaction_base& tx, const std::string& public_id);

// The subjects among `subjects` that are members of the warehouse `warehouse_id`.
std::vector<std::string> members_among(pqxx::transaction_base& tx, const std::string& warehouse_id,
                                       const std::vector<std::string>& subjects);

// Channel `warehouse_code` of app "inventory": scope {"warehouse": "<public id>"}, the
// warehouse's id as its one key, its members as readers; what channel `warehouse` says in SQL.
// The functions open their own connections to `database_url` (one per channel thread).
outlive::CodeChannel warehouse_code_channel(std::string database_url);

}  // namespace inventory
