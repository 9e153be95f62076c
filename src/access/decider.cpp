#include "access/decider.hpp"

#include <pqxx/pqxx>

#include "common/log.hpp"
#include "db/pool.hpp"
#include "db/typed_query.hpp"

namespace outlive::access {

Decider::Decider(db::Pool& pool, Decisions& decisions, size_t max_keys,
                 std::function<void(const std::string&, double)> on_authorize)
    : pool_(pool),
      decisions_(decisions),
      max_keys_(max_keys),
      on_authorize_(std::move(on_authorize)) {}

std::string Decider::decision_id(const std::string& app, const std::string& channel,
                                 const std::string& viewer_id) {
  std::string id;
  decision_id_into(id, app, channel, viewer_id);
  return id;
}

void Decider::decision_id_into(std::string& out, const std::string& app, const std::string& channel,
                               const std::string& viewer_id) {
  out.assign(app).append(1, '\x1f').append(channel).append(1, '\x1f').append(viewer_id);
}

AuthorizeAnswer Decider::authorize_now(pqxx::connection& conn, const std::string& app,
                                       const std::string& channel_name,
                                       const config::Channel& channel, const std::string& key,
                                       const std::vector<std::string>& viewer_ids,
                                       const std::string& viewers_json, uint64_t generation) {
  AuthorizeAnswer answer;
  const auto started = std::chrono::steady_clock::now();
  try {
    const auto rows =
        db::exec_typed(conn, channel.authorize_sql, {"text", "jsonb"}, {key, viewers_json});
    for (const auto& r : rows) {
      if (!r[0].is_null()) answer.allowed.insert(r[0].as<std::string>());
    }
    answer.ok = true;
    const auto now = Decisions::Clock::now();
    std::string id;
    for (const auto& v : viewer_ids) {
      decision_id_into(id, app, channel_name, v);
      decisions_.put_if_current(key, id, answer.allowed.count(v) > 0, now, generation);
    }
  } catch (const std::exception& e) {
    answer.error = e.what();
    log::error("authorize failed", {{"app", app}, {"channel", channel_name}, {"error", e.what()}});
  }
  if (on_authorize_) {
    on_authorize_(
        app, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  return answer;
}

void Decider::authorize(const std::string& app, const std::string& channel_name,
                        const config::Channel& channel, const std::string& key,
                        std::vector<std::string> viewer_ids, std::string viewers_json,
                        uint64_t generation, std::function<void(AuthorizeAnswer)> done,
                        std::function<bool()> wanted) {
  auto task = [this, app, channel_name, ch = &channel, key, ids = std::move(viewer_ids),
               viewers = std::move(viewers_json), generation, done](pqxx::connection& conn) {
    done(authorize_now(conn, app, channel_name, *ch, key, ids, viewers, generation));
  };
  if (!pool_.post(std::move(task), std::move(wanted))) {
    AuthorizeAnswer full;
    full.error = "the database pool has no room";
    done(std::move(full));
  }
}

KeysAnswer Decider::allowed_keys(pqxx::connection& conn, const std::string& app,
                                 const std::string& channel_name, const config::Channel& channel,
                                 const std::string& scope_json, const std::string& viewer_json,
                                 const std::string& viewer_id) {
  KeysAnswer answer;
  const auto rows =
      db::exec_typed(conn, channel.keys_sql, {"jsonb", "jsonb"}, {scope_json, viewer_json});
  std::vector<std::string> keys;
  for (const auto& r : rows) {
    if (r[0].is_null()) continue;
    answer.found = true;
    if (keys.size() >= max_keys_) {
      log::warn(
          "a subscription follows only its first keys",
          {{"app", app}, {"channel", channel_name}, {"limit", max_keys_}, {"keys", rows.size()}});
      break;
    }
    keys.push_back(r[0].as<std::string>());
  }
  const std::string viewers = "[" + viewer_json + "]";
  const std::string id = decision_id(app, channel_name, viewer_id);
  for (const auto& k : keys) {
    const auto now = Decisions::Clock::now();
    const uint64_t generation = decisions_.generation(k);
    auto decision = decisions_.get(k, id, now);
    if (!decision) {
      const auto started = std::chrono::steady_clock::now();
      decision =
          !db::exec_typed(conn, channel.authorize_sql, {"text", "jsonb"}, {k, viewers}).empty();
      if (on_authorize_) {
        on_authorize_(
            app, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      }
      decisions_.put_if_current(k, id, *decision, now, generation);
    }
    if (*decision) answer.allowed.push_back(k);
    answer.generations[k] = generation;
  }
  return answer;
}

bool Decider::changed_since(const std::map<std::string, uint64_t>& generations) const {
  for (const auto& [key, generation] : generations) {
    if (decisions_.generation(key) != generation) return true;
  }
  return false;
}

}  // namespace outlive::access
