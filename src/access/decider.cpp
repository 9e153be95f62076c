#include "access/decider.hpp"

#include <memory>
#include <optional>
#include <utility>

#include "access/code_channels.hpp"
#include "access/sql_channels.hpp"
#include "db/pool.hpp"

namespace outlive::access {

Decider::Decider(db::Pool& pool, Decisions& decisions, size_t max_keys,
                 std::function<void(const std::string&, double)> on_authorize)
    : pool_(pool),
      decisions_(decisions),
      sql_(std::make_unique<SqlChannels>(pool, decisions, max_keys, on_authorize)),
      code_(std::make_unique<CodeChannels>(decisions, max_keys, std::move(on_authorize))) {}

Decider::~Decider() = default;

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

void Decider::authorize(const std::string& app, const std::string& channel_name,
                        const config::Channel& channel, const std::string& key,
                        std::vector<std::string> viewer_ids, std::string viewers_json,
                        uint64_t generation, std::function<void(AuthorizeAnswer)> done,
                        std::function<bool()> wanted) {
  if (channel.code) {
    return code_->authorize(app, channel_name, channel, key, std::move(viewer_ids),
                            std::move(viewers_json), generation, std::move(done));
  }
  sql_->authorize(app, channel_name, channel, key, std::move(viewer_ids), std::move(viewers_json),
                  generation, std::move(done), std::move(wanted));
}

void Decider::authorize_viewer(const std::string& app, const std::string& channel_name,
                               const config::Channel& channel, const std::string& key,
                               const std::string& viewer_id, const std::string& viewer_json,
                               uint64_t generation, std::function<void(AuthorizeAnswer)> done,
                               std::function<bool()> wanted) {
  if (channel.code) {
    return authorize(app, channel_name, channel, key, {viewer_id}, "[" + viewer_json + "]",
                     generation, std::move(done), std::move(wanted));
  }
  sql_->authorize_viewer(app, channel_name, channel, key, viewer_id, viewer_json, generation,
                         std::move(done), std::move(wanted));
}

void Decider::keys(const std::string& app, std::vector<KeysQuery> queries, std::string viewer_json,
                   std::string viewer_id,
                   std::function<void(std::vector<KeysAnswer>, std::string)> done,
                   std::function<bool()> wanted) {
  struct State {
    std::string app, viewer_json, viewer_id;
    std::vector<KeysQuery> queries;
    std::vector<KeysAnswer> answers;
    std::function<void(std::vector<KeysAnswer>, std::string)> done;
  };
  auto state = std::make_shared<State>(State{
      app, std::move(viewer_json), std::move(viewer_id), std::move(queries), {}, std::move(done)});
  state->answers.resize(state->queries.size());
  // The code channels one after the other (each answers on a thread of its choosing), then done.
  auto step = std::make_shared<std::function<void(size_t)>>();
  *step = [this, state, weak = std::weak_ptr(step)](size_t i) {
    while (i < state->queries.size() && !state->queries[i].channel->code) ++i;
    if (i == state->queries.size()) return state->done(std::move(state->answers), "");
    auto next = weak.lock();
    code_->keys(state->app, state->queries[i], state->viewer_json, state->viewer_id,
                [state, i, next](std::optional<KeysAnswer> a, std::string error) {
                  if (!a) return state->done({}, std::move(error));
                  state->answers[i] = std::move(*a);
                  (*next)(i + 1);
                });
  };
  bool any_sql = false;
  for (const auto& q : state->queries) any_sql = any_sql || !q.channel->code;
  if (!any_sql) return (*step)(0);
  // The SQL channels in one pool task, on one connection, as before code channels existed.
  const bool queued = pool_.post(
      [this, state, step](db::Connection& conn) {
        for (bool again = true;;) {
          try {
            for (size_t i = 0; i < state->queries.size(); ++i) {
              const auto& q = state->queries[i];
              if (q.channel->code) continue;
              state->answers[i] =
                  sql_->allowed_keys(conn, state->app, q.channel_name, *q.channel, q.scope_json,
                                     state->viewer_json, state->viewer_id);
            }
          } catch (const std::exception& e) {
            // A connection that died with its server: once more on a fresh one (issue 47).
            if (std::exchange(again, false) && db::reopen_if_lost(conn, &e)) continue;
            std::string error = e.what();
            return state->done({}, error.empty() ? "keys failed" : error);
          }
          break;
        }
        (*step)(0);
      },
      std::move(wanted));
  if (!queued) state->done({}, "the database pool has no room");
}

bool Decider::changed_since(const std::map<std::string, uint64_t>& generations) const {
  for (const auto& [key, generation] : generations) {
    if (decisions_.generation(key) != generation) return true;
  }
  return false;
}

}  // namespace outlive::access
