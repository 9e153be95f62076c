#pragma once
// The C++ writer API (SPEC 2.2, 2.3): an application defines its live updates once, with its app
// id and the JSON Schema of its data, then publishes inside its own libpqxx transactions. Writing
// needs no running replica; cursor() needs the app's NATS.
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <string>
#include <string_view>
#include <vector>

#include <outlive/error.hpp>

namespace outlive {
namespace schema {
class Validator;
}
namespace topic {
class Client;
}

namespace outbox {

// One live update of a key.
struct Update {
  std::string key;      // 1..600 characters; the unit that authorize decides
  nlohmann::json data;  // validated against the app's event schema
  std::optional<std::string> coalesce_key =
      std::nullopt;  // same key in one transaction: one update, last data
};

// An app's live updates. Copies share the schema and the topic connection; const members may be
// called from several threads at once.
class LiveDefinition {
 public:
  // Throws Error(invalid_input) for an app id outside [a-z0-9][a-z0-9-]{0,62} or a bad schema.
  LiveDefinition(std::string app_id, const nlohmann::json& event_schema);
  // Reads schemas/<app>.event.json style files. Throws Error(invalid_input) when the file cannot
  // be read or is not a JSON Schema.
  static LiveDefinition from_schema_file(std::string app_id, const std::string& path);

  // The app id given at construction.
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

  // Connects cursor() to the app's topic: any of `nats_urls` (nats://host:port). Throws
  // Error(nats) when none answers within 10 s. Later calls replace the connection.
  void use_topic(const std::vector<std::string>& nats_urls);

  // The topic's current position as a cursor, for server-side rendering (SPEC 2.2, 5.6): read it
  // before loading the snapshot and hand both to the tab, which subscribes with the cursor; an
  // update committed after the cursor was read is delivered after `subscribed` (perhaps twice:
  // apply idempotently), never lost. Throws Error(invalid_input) before use_topic(), Error(nats)
  // when the topic cannot be read.
  std::string cursor() const;

 private:
  std::string app_id_;
  std::shared_ptr<const schema::Validator> validator_;
  std::shared_ptr<topic::Client> topic_;
};

// True for an app id of [a-z0-9][a-z0-9-]{0,62}.
bool valid_app_id(std::string_view app_id);

}  // namespace outbox

using outbox::LiveDefinition;
using outbox::Update;

}  // namespace outlive
