#include "access/sql_channels.hpp"

#include <algorithm>
#include <utility>

#include "common/log.hpp"
#include "db/access_queries.hpp"
#include "db/pool.hpp"

namespace outlive::access {

namespace {
constexpr size_t kJoinedViewers = 500;  // an authorize() call's viewers at most (SPEC 5.5)
}

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

struct SqlChannels::Joined {
  struct Waiter {
    std::string viewer_id;
    std::function<void(AuthorizeAnswer)> done;
    std::function<bool()> wanted;
  };
  std::vector<std::string> ids;  // distinct
  std::string viewers_json;      // their viewer objects, comma-separated
  std::vector<Waiter> waiters;
};

void SqlChannels::authorize_viewer(const std::string& app, const std::string& channel_name,
                                   const config::Channel& channel, const std::string& key,
                                   const std::string& viewer_id, const std::string& viewer_json,
                                   uint64_t generation, std::function<void(AuthorizeAnswer)> done,
                                   std::function<bool()> wanted) {
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
void SqlChannels::close_joined(const JoinKey& key, const std::shared_ptr<Joined>& batch) {
  std::lock_guard lock(joined_mutex_);
  if (auto it = joining_.find(key); it != joining_.end() && it->second == batch) joining_.erase(it);
}

void SqlChannels::run_joined(db::Connection& conn, const JoinKey& key,
                             const config::Channel& channel, const std::shared_ptr<Joined>& batch) {
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

KeysAnswer SqlChannels::allowed_keys(db::Connection& conn, const std::string& app,
                                     const std::string& channel_name,
                                     const config::Channel& channel, const std::string& scope_json,
                                     const std::string& viewer_json, const std::string& viewer_id) {
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
  const std::string id = Decider::decision_id(app, channel_name, viewer_id);
  for (const auto& k : keys) {
    const auto now = Decisions::Clock::now();
    const uint64_t generation = decisions_.generation(k);
    auto decision = decisions_.get(k, id, now);
    if (!decision) {
      const auto started = std::chrono::steady_clock::now();
      // Any row allows, as before: a row of NULL too.
      decision = !db::AccessQueries::authorize(conn, channel.authorize_sql, k, viewers).empty();
      observe(app, started);
      decisions_.put_if_current(k, id, *decision, now, generation);
    }
    if (*decision) answer.allowed.push_back(k);
    answer.generations[k] = generation;
  }
  return answer;
}

}  // namespace outlive::access
