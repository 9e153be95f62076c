#include "access/sql_channels.hpp"

#include <algorithm>
#include <utility>

#include "common/log.hpp"
#include "db/access_queries.hpp"
#include "db/pool.hpp"

namespace outlive::access {

SqlChannels::SqlChannels(db::Pool& pool, Decisions& decisions, size_t max_keys,
                         std::function<void(const std::string&, double)> on_authorize)
    : pool_(pool),
      decisions_(decisions),
      max_keys_(max_keys),
      on_authorize_(std::move(on_authorize)) {}

void SqlChannels::observe(const std::string& app,
                          std::chrono::steady_clock::time_point started) const {
  if (on_authorize_) {
    on_authorize_(
        app, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
}

AuthorizeAnswer SqlChannels::authorize_now(db::Connection& conn, const std::string& app,
                                           const std::string& channel_name,
                                           const config::Channel& channel, const std::string& key,
                                           const std::vector<std::string>& viewer_ids,
                                           const std::string& viewers_json, uint64_t generation) {
  AuthorizeAnswer answer;
  const auto started = std::chrono::steady_clock::now();
  for (bool again = true;;) {
    try {
      for (auto& id : db::AccessQueries::authorize(conn, channel.authorize_sql, key, viewers_json)) {
        if (id) answer.allowed.insert(std::move(*id));
      }
      answer.ok = true;
      const auto now = Decisions::Clock::now();
      std::string id;
      for (const auto& v : viewer_ids) {
        Decider::decision_id_into(id, app, channel_name, v);
        decisions_.put_if_current(key, id, answer.allowed.count(v) > 0, now, generation);
      }
    } catch (const std::exception& e) {
      // A connection that died with its server (a restart) must not cost these viewers their
      // sockets: asked once more on a fresh one.
      if (std::exchange(again, false) && db::reopen_if_lost(conn, &e)) continue;
      answer.error = e.what();
      log::limited(log::Level::error, "authorize failed",
                   {{"app", app}, {"channel", channel_name}, {"error", e.what()}});
    }
    break;
  }
  observe(app, started);
  return answer;
}

void SqlChannels::authorize(const std::string& app, const std::string& channel_name,
                            const config::Channel& channel, const std::string& key,
                            std::vector<std::string> viewer_ids, std::string viewers_json,
                            uint64_t generation, std::function<void(AuthorizeAnswer)> done,
                            std::function<bool()> wanted) {
  auto task = [this, app, channel_name, ch = &channel, key, ids = std::move(viewer_ids),
               viewers = std::move(viewers_json), generation, done](db::Connection& conn) {
    done(authorize_now(conn, app, channel_name, *ch, key, ids, viewers, generation));
  };
  if (!pool_.post(std::move(task), std::move(wanted))) {
    AuthorizeAnswer full;
    full.error = "the database pool has no room";
    done(std::move(full));
  }
}

void SqlChannels::authorize_viewer(const std::string& app, const std::string& channel_name,
                                   const config::Channel& channel, const std::string& viewer_id,
                                   const std::string& viewer_json, std::vector<ViewerAsk> asks,
                                   std::function<bool()> wanted) {
  std::vector<Started> starting;
  for (auto& ask : asks) {
    AuthorizeJoins::Key key{app, channel_name, std::move(ask.key), ask.generation};
    if (auto batch = joins_.join(key, viewer_id, viewer_json, std::move(ask.done), wanted))
      starting.push_back(Started{std::move(key), &channel, std::move(batch)});
  }
  if (!starting.empty()) run(std::move(starting));
}

void SqlChannels::run(std::vector<Started> batches) {
  auto shared = std::make_shared<std::vector<Started>>(std::move(batches));
  auto task = [this, shared](db::Connection& conn) {
    std::vector<Started> next;
    for (auto& s : *shared) joins_.started(s.key, s.batch);
    for (auto& s : *shared) {
      const auto& [app, channel_name, key, generation] = s.key;
      std::optional<AuthorizeAnswer> answer;
      if (s.batch->wanted()) {  // else every socket that asked is gone
        answer = authorize_now(conn, app, channel_name, *s.channel, key, s.batch->ids,
                               s.batch->viewers_json(), generation);
      }
      if (auto gathered = joins_.finished(s.key, s.batch, answer ? &*answer : nullptr))
        next.push_back(Started{s.key, s.channel, std::move(gathered)});
    }
    if (!next.empty()) run(std::move(next));
  };
  // Without `wanted`: viewers of other sockets may have joined these batches. Gathering: while
  // the pool has sockets' own questions to answer, more viewers join these calls.
  if (pool_.post(std::move(task), {}, db::Urgency::gathering)) return;
  // Everyone who joined is answered as for a timeout (SPEC 5.8); what gathered meanwhile too.
  AuthorizeAnswer full;
  full.error = "the database pool has no room";
  std::vector<Started> refused = std::move(*shared);
  while (!refused.empty()) {
    std::vector<Started> next;
    for (auto& s : refused) {
      if (auto gathered = joins_.finished(s.key, s.batch, &full))
        next.push_back(Started{s.key, s.channel, std::move(gathered)});
    }
    refused = std::move(next);
  }
}

std::vector<FoundKeys> SqlChannels::find_keys(db::Connection& conn, const std::string& app,
                                              const std::string& channel_name,
                                              const config::Channel& channel,
                                              const std::vector<std::string>& scope_jsons,
                                              const std::string& viewer_json,
                                              const std::string& viewer_id) {
  std::vector<FoundKeys> out;
  out.reserve(scope_jsons.size());
  for (auto& column : db::AccessQueries::keys(conn, channel.keys_sql, scope_jsons, viewer_json)) {
    std::vector<std::string> keys;
    bool found = false;
    for (auto& r : column) {
      found = true;
      if (r) keys.push_back(std::move(*r));
    }
    out.push_back(
        with_decisions(decisions_, max_keys_, app, channel_name, viewer_id, std::move(keys), found));
  }
  return out;
}

}  // namespace outlive::access
