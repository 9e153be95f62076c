#pragma once
// The C++ writer API (SPEC 2.2, 2.3): an application defines its live updates once, with its app id
// and the JSON Schema of its data, then publishes inside its own libpqxx transactions.
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <string>

#include "schema/validator.hpp"

namespace outlive::outbox {

struct Update {
  std::string key;      // 1..600 characters; the unit that authorize decides
  nlohmann::json data;  // validated against the app's event schema
  std::optional<std::string> coalesce_key =
      std::nullopt;  // same key in one transaction: one update, last data
};

class LiveDefinition {
 public:
  // Throws Error(invalid_input) for an app id outside [a-z0-9][a-z0-9-]{0,62} or a bad schema.
  LiveDefinition(std::string app_id, const nlohmann::json& event_schema);
  // Reads schemas/<app>.event.json style files.
  static LiveDefinition from_schema_file(std::string app_id, const std::string& path);

  const std::string& app_id() const { return app_id_; }

  // Writes one update in `tx`. Throws Error(invalid_input) naming the failing path when `data`
  // violates the schema, before anything is written; the caller's transaction then rolls back.
  void publish(pqxx::transaction_base& tx, const Update& update) const;

  // Writes an access update for `key` (a row of its own), then the data update if given.
  void publish_access(pqxx::transaction_base& tx, const std::string& key,
                      const std::optional<nlohmann::json>& data = std::nullopt) const;

  // Asks the replicas to publish now. Call after commit, on any connection.
  void wake(pqxx::connection_base& conn) const;

  // Throws Error(invalid_input) when `data` violates the schema.
  void validate(const nlohmann::json& data) const;

 private:
  std::string app_id_;
  schema::Validator validator_;
};

bool valid_app_id(std::string_view app_id);

}  // namespace outlive::outbox
