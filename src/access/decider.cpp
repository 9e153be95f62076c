#include "access/decider.hpp"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "access/code_channels.hpp"
#include "common/log.hpp"
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
  std::vector<ViewerAsk> asks;
  asks.push_back(ViewerAsk{key, generation, std::move(done)});
  if (channel.code) {
    return code_->authorize_viewer(app, channel_name, channel, viewer_id, viewer_json,
                                   std::move(asks), std::move(wanted));
  }
  sql_->authorize_viewer(app, channel_name, channel, viewer_id, viewer_json, std::move(asks),
                         std::move(wanted));
}

FoundKeys with_decisions(Decisions& decisions, size_t max_keys, const std::string& app,
                         const std::string& channel, const std::string& viewer_id,
                         std::vector<std::string> keys, bool found) {
  FoundKeys out;
  out.found = found;
  const std::string id = Decider::decision_id(app, channel, viewer_id);
  for (auto& k : keys) {
    if (out.keys.size() >= max_keys) {
      log::limited(log::Level::warn, "a subscription follows only its first keys",
                   {{"app", app}, {"channel", channel}, {"limit", max_keys}, {"keys", keys.size()}});
      break;
    }
    // The generation before the decision: an access update read after it is seen by the sub.
    const auto [at, fresh] = out.generations.emplace(k, decisions.generation(k));
    if (!fresh) continue;
    out.decisions.push_back(decisions.get(k, id, Decisions::Clock::now()));
    out.keys.push_back(std::move(k));
  }
  return out;
}

// A sub's keys() in two steps: keys() with the cached decisions, then authorize() for the keys
// without one, joined with the other viewers asking for them (a page-load wave, a reconnect
// storm).
struct Decider::KeysState {
  std::string app, viewer_json, viewer_id;
  std::vector<KeysQuery> queries;
  std::vector<FoundKeys> found;
  std::function<void(std::vector<KeysAnswer>, std::string)> done;
  std::function<bool()> wanted;
  std::mutex mutex;  // the authorize() answers arrive on any thread
  size_t left = 0;
  std::string error;

  void finish() {
    if (!error.empty()) return done({}, error);
    std::vector<KeysAnswer> answers(found.size());
    for (size_t i = 0; i < found.size(); ++i) {
      answers[i].found = found[i].found;
      answers[i].generations = std::move(found[i].generations);
      for (size_t j = 0; j < found[i].keys.size(); ++j) {
        if (found[i].decisions[j].value_or(false))
          answers[i].allowed.push_back(std::move(found[i].keys[j]));
      }
    }
    done(std::move(answers), "");
  }
};

void Decider::keys(const std::string& app, std::vector<KeysQuery> queries, std::string viewer_json,
                   std::string viewer_id,
                   std::function<void(std::vector<KeysAnswer>, std::string)> done,
                   std::function<bool()> wanted) {
  auto state = std::make_shared<KeysState>();
  state->app = app;
  state->viewer_json = std::move(viewer_json);
  state->viewer_id = std::move(viewer_id);
  state->queries = std::move(queries);
  state->found.resize(state->queries.size());
  state->done = std::move(done);
  state->wanted = wanted;
  // The code channels one after the other (each answers on a thread of its choosing), then the
  // undecided keys of all.
  auto step = std::make_shared<std::function<void(size_t)>>();
  *step = [this, state, weak = std::weak_ptr(step)](size_t i) {
    while (i < state->queries.size() && !state->queries[i].channel->code) ++i;
    if (i == state->queries.size()) return ask_undecided(state);
    auto next = weak.lock();
    code_->keys(state->app, state->queries[i], state->viewer_json, state->viewer_id,
                [state, i, next](std::optional<FoundKeys> found, std::string error) {
                  if (!found) return state->done({}, std::move(error));
                  state->found[i] = std::move(*found);
                  (*next)(i + 1);
                });
  };
  bool any_sql = false;
  for (const auto& q : state->queries) any_sql = any_sql || !q.channel->code;
  if (!any_sql) return (*step)(0);
  // The SQL channels' keys() in one pool task, on one connection; a channel's queries in one
  // round trip (a socket's subs on one channel: one wait for Postgres, not one per sub).
  const bool queued = pool_.post(
      [this, state, step](db::Connection& conn) {
        for (bool again = true;;) {
          try {
            std::map<std::string, std::vector<size_t>> by_channel;  // SQL queries, in order
            for (size_t i = 0; i < state->queries.size(); ++i) {
              if (!state->queries[i].channel->code)
                by_channel[state->queries[i].channel_name].push_back(i);
            }
            for (const auto& [name, indices] : by_channel) {
              const auto& channel = *state->queries[indices.front()].channel;
              std::vector<std::string> scopes;
              scopes.reserve(indices.size());
              for (size_t i : indices) scopes.push_back(state->queries[i].scope_json);
              auto found = sql_->find_keys(conn, state->app, name, channel, scopes,
                                           state->viewer_json, state->viewer_id);
              for (size_t n = 0; n < indices.size(); ++n)
                state->found[indices[n]] = std::move(found[n]);
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

void Decider::ask_undecided(const std::shared_ptr<KeysState>& state) {
  std::vector<std::vector<ViewerAsk>> asks(state->found.size());
  size_t total = 0;
  for (size_t i = 0; i < state->found.size(); ++i) {
    const auto& f = state->found[i];
    for (size_t j = 0; j < f.keys.size(); ++j) {
      if (f.decisions[j]) continue;
      asks[i].push_back(ViewerAsk{f.keys[j], f.generations.at(f.keys[j]),
                                  [state, i, j](AuthorizeAnswer a) {
                                    bool last;
                                    {
                                      std::lock_guard lock(state->mutex);
                                      if (!a.ok && state->error.empty())
                                        state->error = a.error.empty() ? "authorize failed" : a.error;
                                      state->found[i].decisions[j] =
                                          a.allowed.count(state->viewer_id) > 0;
                                      last = --state->left == 0;
                                    }
                                    if (last) state->finish();
                                  }});
      total++;
    }
  }
  if (total == 0) return state->finish();
  state->left = total;
  // Counted before the first ask: an answer may arrive before the last is asked.
  for (size_t i = 0; i < asks.size(); ++i) {
    if (asks[i].empty()) continue;
    const auto& q = state->queries[i];
    if (q.channel->code) {
      code_->authorize_viewer(state->app, q.channel_name, *q.channel, state->viewer_id,
                              state->viewer_json, std::move(asks[i]), state->wanted);
    } else {
      sql_->authorize_viewer(state->app, q.channel_name, *q.channel, state->viewer_id,
                             state->viewer_json, std::move(asks[i]), state->wanted);
    }
  }
}

bool Decider::changed_since(const std::map<std::string, uint64_t>& generations) const {
  for (const auto& [key, generation] : generations) {
    if (decisions_.generation(key) != generation) return true;
  }
  return false;
}

}  // namespace outlive::access
