#pragma once
// The one place that decides access (SPEC 5.4, 5.5): keys() for a subscription and authorize()
// for a key, with the decision cache in front of both. The dispatcher (live delivery), a reader
// catching up from the window and a `sub` all decide through it, with the same cache rules.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "access/decisions.hpp"
#include "config/config.hpp"

namespace outlive::db {
class Pool;
}

namespace outlive::access {

struct AuthorizeAnswer {
  bool ok = false;                // false: authorize threw, or the pool had no room
  std::set<std::string> allowed;  // viewer ids
  std::string error;
};

// keys(scope, viewer) filtered by the viewer's access, with the decision generations they were
// made under (a sub compares them after registering, so an access update read meanwhile is seen).
struct KeysAnswer {
  bool found = false;  // keys() returned at least one row
  std::vector<std::string> allowed;
  std::map<std::string, uint64_t> generations;
};

// keys() of one query before authorize() is asked: the keys in keys() order (each once, at most
// max_keys), each with its cached decision, nullopt where authorize() must be asked; and the
// generations the decisions are made under.
struct FoundKeys {
  bool found = false;
  std::vector<std::string> keys;
  std::vector<std::optional<bool>> decisions;
  std::map<std::string, uint64_t> generations;
};

// FoundKeys of `keys` (what keys() returned; `found`: it returned a row): repeats dropped, the
// first `max_keys` kept (a warning says so), each with the viewer's cached decision.
FoundKeys with_decisions(Decisions& decisions, size_t max_keys, const std::string& app,
                         const std::string& channel, const std::string& viewer_id,
                         std::vector<std::string> keys, bool found);

// One viewer's authorize(key) asked through the joins (authorize_joins.hpp).
struct ViewerAsk {
  std::string key;
  uint64_t generation = 0;
  std::function<void(AuthorizeAnswer)> done;
};

// One keys() question of a viewer: a channel (SQL or code) and the sub's scope.
struct KeysQuery {
  std::string channel_name;
  const config::Channel* channel = nullptr;
  std::string scope_json;
};

class SqlChannels;
class CodeChannels;

// SQL channels are asked on a pool worker with its connection (SqlChannels); code channels
// (config::Channel::code) are asked through their functions on the decider's channel threads, and
// answer whenever they like (CodeChannels). Both kinds are cached alike, and every caller keeps one
// path: authorize() and keys() below answer through a callback for either kind (the callers own
// the 10 s deadline).
class Decider {
 public:
  // `on_authorize` observes every authorize() call with its latency in seconds.
  Decider(db::Pool& pool, Decisions& decisions, size_t max_keys,
          std::function<void(const std::string& app, double seconds)> on_authorize = {});
  ~Decider();  // waits for code functions running on the channel threads

  Decisions& decisions() { return decisions_; }

  // The cache id of a viewer's decision for a channel of an app: (key, app, channel, viewer id).
  static std::string decision_id(const std::string& app, const std::string& channel,
                                 const std::string& viewer_id);
  static void decision_id_into(std::string& out, const std::string& app, const std::string& channel,
                               const std::string& viewer_id);

  // authorize(key, viewers) on a pool worker, viewers being a JSON array of at most 500 viewer
  // objects with ids `viewer_ids`. The answers are cached unless an access update of `key` was read
  // after `generation` (they still answer the update they were asked for). `done` runs on the
  // worker; at once (not ok) when the pool has no room. Work no longer `wanted` is dropped.
  void authorize(const std::string& app, const std::string& channel_name,
                 const config::Channel& channel, const std::string& key,
                 std::vector<std::string> viewer_ids, std::string viewers_json, uint64_t generation,
                 std::function<void(AuthorizeAnswer)> done, std::function<bool()> wanted = {});

  // One viewer's authorize(key), for a socket catching up from the window that found no cached
  // decision (and for a sub's keys() below): joined with the other viewers asked for the same
  // key, channel and generation (authorize_joins.hpp: while a call waits to start, up to 500
  // viewers), so thousands of sockets subscribing or catching up at once take a few places in
  // the pool's bounded queue and a few calls, not one each; the same for code and hook channels.
  // `done` gets an answer about this viewer alone.
  void authorize_viewer(const std::string& app, const std::string& channel_name,
                        const config::Channel& channel, const std::string& key,
                        const std::string& viewer_id, const std::string& viewer_json,
                        uint64_t generation, std::function<void(AuthorizeAnswer)> done,
                        std::function<bool()> wanted = {});

  // keys(scope, viewer) for each query, in order, for channels of either kind, keeping the keys
  // the viewer may read: cached decisions, else authorize() joined with other viewers as
  // authorize_viewer() does. `done` runs once, on a pool worker or a thread a code channel
  // answered on, with every answer, or with an error (a keys() or authorize() that failed, no
  // room in the pool).
  void keys(const std::string& app, std::vector<KeysQuery> queries, std::string viewer_json,
            std::string viewer_id,
            std::function<void(std::vector<KeysAnswer> answers, std::string error)> done,
            std::function<bool()> wanted = {});

  // True when an access update of one of the keys was read since `generations` were taken.
  bool changed_since(const std::map<std::string, uint64_t>& generations) const;

  db::Pool& pool() { return pool_; }

 private:
  struct KeysState;
  void ask_undecided(const std::shared_ptr<KeysState>& state);
  db::Pool& pool_;
  Decisions& decisions_;
  std::unique_ptr<SqlChannels> sql_;
  std::unique_ptr<CodeChannels> code_;
};

}  // namespace outlive::access
