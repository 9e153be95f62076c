#include "outbox/live.hpp"

#include <fstream>
#include <regex>

#include "common/error.hpp"
#include "outbox/pg_error.hpp"
#include "schema/validator.hpp"
#include "topic/client.hpp"

namespace outlive::outbox {

bool valid_app_id(std::string_view app_id) {
  static const std::regex pattern("^[a-z0-9][a-z0-9-]{0,62}$");
  return std::regex_match(app_id.begin(), app_id.end(), pattern);
}

namespace {
std::string checked_app_id(std::string app_id) {
  if (!valid_app_id(app_id)) {
    throw Error(Errc::invalid_input,
                "app id \"" + app_id + "\" must match [a-z0-9][a-z0-9-]{0,62}");
  }
  return app_id;
}
}  // namespace

LiveDefinition::LiveDefinition(std::string app_id, const nlohmann::json& event_schema)
    : app_id_(checked_app_id(std::move(app_id))),
      validator_(std::make_shared<const schema::Validator>(event_schema)) {}

void LiveDefinition::use_topic(const std::vector<std::string>& nats_urls) {
  topic_ = std::make_shared<topic::Client>(nats_urls, "outlive-writer-" + app_id_);
}

std::string LiveDefinition::cursor() const {
  if (!topic_) {
    throw Error(Errc::invalid_input,
                "cursor() of \"" + app_id_ + "\" needs use_topic() with the app's NATS first");
  }
  return topic_->head_cursor(app_id_);
}

LiveDefinition LiveDefinition::from_schema_file(std::string app_id, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(Errc::invalid_input, "cannot read event schema " + path);
  try {
    return LiveDefinition(std::move(app_id), nlohmann::json::parse(in));
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::invalid_input, "event schema " + path + " is not JSON: " + e.what());
  }
}

void LiveDefinition::validate(const nlohmann::json& data) const {
  if (auto failure = validator_->check(data)) {
    throw Error(Errc::invalid_input,
                "live update of \"" + app_id_ + "\" violates its event schema at " + *failure);
  }
}

void LiveDefinition::publish(pqxx::transaction_base& tx, const Update& update) const {
  validate(update.data);
  try {
    tx.exec_params(
        "SELECT events.enqueue(gen_random_uuid(), $1, 'live', $2,"
        " jsonb_build_object('v', 1, 'k', $2::text, 'd', $3::jsonb), $4)",
        app_id_, update.key, update.data.dump(),
        update.coalesce_key ? update.coalesce_key->c_str() : nullptr);
  } catch (...) {
    rethrow_as_error("publish " + app_id_);
  }
}

void LiveDefinition::publish_access(pqxx::transaction_base& tx, const std::string& key,
                                    const std::optional<nlohmann::json>& data) const {
  if (data) validate(*data);
  const std::string text = data ? data->dump() : std::string();
  try {
    tx.exec_params("SELECT events.publish_live($1, $2, $3::jsonb, true)", app_id_, key,
                   data ? text.c_str() : nullptr);
  } catch (...) {
    rethrow_as_error("publish_access " + app_id_);
  }
}

void LiveDefinition::wake(pqxx::connection_base& conn) const {
  try {
    pqxx::nontransaction tx(conn);
    tx.exec_params("SELECT events.wake($1)", app_id_);
  } catch (...) {
    rethrow_as_error("wake " + app_id_);
  }
}

}  // namespace outlive::outbox
