#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include "access/decider.hpp"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <mutex>
#include <shared_mutex>

#include "common/log.hpp"
#include "db/access_queries.hpp"
#include "db/pool.hpp"

namespace outlive::access {

// Code channels' functions run on threads of their own, so one that blocks (an application
// calling its own database or another service synchronously) never holds a socket's strand or the
// dispatcher's thread. Their answers may arrive after the decider is gone (a Reply kept by the
// application): `guard` lets such a late answer find out, and makes the destructor wait for one
// being handled.
struct Decider::Code {
  struct Guard {
    std::shared_mutex mutex;
    bool alive = true;
  };
  std::shared_ptr<Guard> guard = std::make_shared<Guard>();
  boost::asio::thread_pool threads{2};
};

Decider::Decider(db::Pool& pool, Decisions& decisions, size_t max_keys,
                 std::function<void(const std::string&, double)> on_authorize)
    : pool_(pool),
      decisions_(decisions),
      max_keys_(max_keys),
      on_authorize_(std::move(on_authorize)),
      code_(std::make_unique<Code>()) {}

Decider::~Decider() {
  {
    std::unique_lock lock(code_->guard->mutex);
    code_->guard->alive = false;
  }
  code_->threads.stop();
  code_->threads.join();
}

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

AuthorizeAnswer Decider::authorize_now(db::Connection& conn, const std::string& app,
                                       const std::string& channel_name,
                                       const config::Channel& channel, const std::string& key,
                                       const std::vector<std::string>& viewer_ids,
                                       const std::string& viewers_json, uint64_t generation) {
  AuthorizeAnswer answer;
  const auto started = std::chrono::steady_clock::now();
  try {
    for (auto& id : db::AccessQueries::authorize(conn, channel.authorize_sql, key, viewers_json)) {
      if (id) answer.allowed.insert(std::move(*id));
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
    log::limited(log::Level::error, "authorize failed",
                 {{"app", app}, {"channel", channel_name}, {"error", e.what()}});
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
  if (channel.code) {
    return authorize_code(app, channel_name, channel, key, std::move(viewer_ids),
                          std::move(viewers_json), generation, std::move(done));
  }
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

struct Decider::Joined {
  struct Waiter {
    std::string viewer_id;
    std::function<void(AuthorizeAnswer)> done;
    std::function<bool()> wanted;
  };
  std::vector<std::string> ids;  // distinct
  std::string viewers_json;      // their viewer objects, comma-separated
  std::vector<Waiter> waiters;
};

namespace {
constexpr size_t kJoinedViewers = 500;  // an authorize() call's viewers at most (SPEC 5.5)
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
  JoinKey join{app, channel_name, key, generation};
  std::shared_ptr<Joined> batch;
  bool first = false;
  {
    std::lock_guard lock(joined_mutex_);
    auto& slot = joining_[join];
    if (!slot) {
      slot = std::make_shared<Joined>();
      first = true;
    }
    batch = slot;
    if (std::find(batch->ids.begin(), batch->ids.end(), viewer_id) == batch->ids.end()) {
      if (!batch->ids.empty()) batch->viewers_json += ',';
      batch->viewers_json += viewer_json;
      batch->ids.push_back(viewer_id);
    }
    batch->waiters.push_back(Joined::Waiter{viewer_id, std::move(done), std::move(wanted)});
    if (batch->ids.size() >= kJoinedViewers)
      joining_.erase(join);  // full: the next one starts another
  }
  if (!first) return;
  auto task = [this, join, ch = &channel, batch](db::Connection& conn) {
    run_joined(conn, join, *ch, batch);
  };
  if (!pool_.post(std::move(task))) {
    // Everyone who joined meanwhile is answered as for a timeout (SPEC 5.8).
    close_joined(join, batch);
    AuthorizeAnswer full;
    full.error = "the database pool has no room";
    for (auto& w : batch->waiters) w.done(full);
  }
}

// Takes the batch out of the map, so no one joins it any more (it may have left already, full).
void Decider::close_joined(const JoinKey& key, const std::shared_ptr<Joined>& batch) {
  std::lock_guard lock(joined_mutex_);
  if (auto it = joining_.find(key); it != joining_.end() && it->second == batch) joining_.erase(it);
}

void Decider::run_joined(db::Connection& conn, const JoinKey& key, const config::Channel& channel,
                         const std::shared_ptr<Joined>& batch) {
  close_joined(key, batch);
  const auto& [app, channel_name, update_key, generation] = key;
  bool anyone = false;
  for (const auto& w : batch->waiters) anyone = anyone || !w.wanted || w.wanted();
  if (!anyone) return;  // every socket that asked is gone
  const AuthorizeAnswer answer =
      authorize_now(conn, app, channel_name, channel, update_key, batch->ids,
                    "[" + batch->viewers_json + "]", generation);
  for (auto& w : batch->waiters) {
    AuthorizeAnswer own;
    own.ok = answer.ok;
    own.error = answer.error;
    if (answer.allowed.count(w.viewer_id)) own.allowed.insert(w.viewer_id);
    w.done(std::move(own));
  }
}

KeysAnswer Decider::allowed_keys(db::Connection& conn, const std::string& app,
                                 const std::string& channel_name, const config::Channel& channel,
                                 const std::string& scope_json, const std::string& viewer_json,
                                 const std::string& viewer_id) {
  KeysAnswer answer;
  auto rows = db::AccessQueries::keys(conn, channel.keys_sql, scope_json, viewer_json);
  std::vector<std::string> keys;
  for (auto& r : rows) {
    if (!r) continue;
    answer.found = true;
    if (keys.size() >= max_keys_) {
      log::limited(
          log::Level::warn, "a subscription follows only its first keys",
          {{"app", app}, {"channel", channel_name}, {"limit", max_keys_}, {"keys", rows.size()}});
      break;
    }
    keys.push_back(std::move(*r));
  }
  const std::string viewers = "[" + viewer_json + "]";
  const std::string id = decision_id(app, channel_name, viewer_id);
  for (const auto& k : keys) {
    const auto now = Decisions::Clock::now();
    const uint64_t generation = decisions_.generation(k);
    auto decision = decisions_.get(k, id, now);
    if (!decision) {
      const auto started = std::chrono::steady_clock::now();
      // Any row allows, as before: a row of NULL too.
      decision = !db::AccessQueries::authorize(conn, channel.authorize_sql, k, viewers).empty();
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

void Decider::authorize_code(const std::string& app, const std::string& channel_name,
                             const config::Channel& channel, const std::string& key,
                             std::vector<std::string> viewer_ids, std::string viewers_json,
                             uint64_t generation, std::function<void(AuthorizeAnswer)> done) {
  const auto started = std::chrono::steady_clock::now();
  Reply<AllowedViewers> reply(
      [this, guard = code_->guard, app, channel_name, key, ids = std::move(viewer_ids), generation,
       started, done = std::move(done)](std::optional<AllowedViewers> allowed, std::string error) {
        std::shared_lock lock(guard->mutex);
        if (!guard->alive) return;
        AuthorizeAnswer answer;
        if (allowed) {
          answer.ok = true;
          answer.allowed.insert(allowed->begin(), allowed->end());
          const auto now = Decisions::Clock::now();
          std::string id;
          for (const auto& v : ids) {
            decision_id_into(id, app, channel_name, v);
            decisions_.put_if_current(key, id, answer.allowed.count(v) > 0, now, generation);
          }
        } else {
          answer.error = std::move(error);
          log::limited(log::Level::error, "authorize failed",
                       {{"app", app}, {"channel", channel_name}, {"error", answer.error}});
        }
        if (on_authorize_) {
          on_authorize_(
              app,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
        }
        done(std::move(answer));
      });
  boost::asio::post(code_->threads, [code = channel.code, key, viewers = std::move(viewers_json),
                                     reply = std::move(reply)] {
    try {
      code->authorize(key, nlohmann::json::parse(viewers), reply);
    } catch (const std::exception& e) {
      reply.fail(e.what());
    } catch (...) {
      reply.fail("authorize threw");
    }
  });
}

void Decider::keys_code(const std::string& app, const KeysQuery& query,
                        const std::string& viewer_json, const std::string& viewer_id,
                        std::function<void(std::optional<KeysAnswer>, std::string)> done) {
  Reply<KeysResult> reply([this, guard = code_->guard, app, name = query.channel_name,
                           channel = query.channel, viewer_json, viewer_id, done = std::move(done)](
                              std::optional<KeysResult> result, std::string error) {
    std::shared_lock lock(guard->mutex);
    if (!guard->alive) return;
    if (!result) {
      log::limited(log::Level::error, "keys failed",
                   {{"app", app}, {"channel", name}, {"error", error}});
      return done(std::nullopt, std::move(error));
    }
    if (!*result) return done(KeysAnswer{}, "");  // not found
    // The keys the viewer may read, from the cache or asked of authorize() all at once.
    struct Gather {
      std::mutex mutex;
      KeysAnswer answer;
      std::vector<std::string> keys;
      std::vector<char> allowed;
      size_t left = 0;
      std::string error;
      std::function<void(std::optional<KeysAnswer>, std::string)> done;
      void finish() {
        if (!error.empty()) return done(std::nullopt, error);
        for (size_t i = 0; i < keys.size(); ++i) {
          if (allowed[i]) answer.allowed.push_back(keys[i]);
        }
        done(std::move(answer), "");
      }
    };
    auto g = std::make_shared<Gather>();
    g->done = done;
    g->answer.found = true;
    for (auto& k : **result) {
      if (g->keys.size() >= max_keys_) {
        log::limited(
            log::Level::warn, "a subscription follows only its first keys",
            {{"app", app}, {"channel", name}, {"limit", max_keys_}, {"keys", (*result)->size()}});
        break;
      }
      if (!g->answer.generations.count(k)) {
        g->answer.generations[k] = decisions_.generation(k);
        g->keys.push_back(std::move(k));
      }
    }
    g->allowed.assign(g->keys.size(), 0);
    const std::string id = decision_id(app, name, viewer_id);
    std::vector<size_t> ask;
    for (size_t i = 0; i < g->keys.size(); ++i) {
      const auto cached = decisions_.get(g->keys[i], id, Decisions::Clock::now());
      if (cached) {
        g->allowed[i] = *cached;
      } else {
        ask.push_back(i);
      }
    }
    g->left = ask.size();
    if (ask.empty()) return g->finish();
    const std::string viewers = "[" + viewer_json + "]";
    for (size_t i : ask) {
      const auto& k = g->keys[i];
      authorize_code(app, name, *channel, k, {viewer_id}, viewers, g->answer.generations[k],
                     [g, i, viewer_id](AuthorizeAnswer a) {
                       bool last;
                       {
                         std::lock_guard lock(g->mutex);
                         if (!a.ok && g->error.empty()) g->error = a.error;
                         g->allowed[i] = a.allowed.count(viewer_id) > 0;
                         last = --g->left == 0;
                       }
                       if (last) g->finish();
                     });
    }
  });
  boost::asio::post(code_->threads, [code = query.channel->code, scope = query.scope_json,
                                     viewer = viewer_json, reply = std::move(reply)] {
    try {
      code->keys(nlohmann::json::parse(scope), nlohmann::json::parse(viewer), reply);
    } catch (const std::exception& e) {
      reply.fail(e.what());
    } catch (...) {
      reply.fail("keys threw");
    }
  });
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
    keys_code(state->app, state->queries[i], state->viewer_json, state->viewer_id,
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
        try {
          for (size_t i = 0; i < state->queries.size(); ++i) {
            const auto& q = state->queries[i];
            if (q.channel->code) continue;
            state->answers[i] = allowed_keys(conn, state->app, q.channel_name, *q.channel,
                                             q.scope_json, state->viewer_json, state->viewer_id);
          }
        } catch (const std::exception& e) {
          std::string error = e.what();
          return state->done({}, error.empty() ? "keys failed" : error);
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
