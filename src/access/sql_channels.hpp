#pragma once
// SQL channels' keys() and authorize() (config::Channel::keys_sql, authorize_sql): asked on a pool
// worker's connection through db::AccessQueries, their answers put in the decision cache. The
// decider (decider.hpp) sends SQL channels here and code channels to CodeChannels.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "access/authorize_joins.hpp"
#include "access/decider.hpp"

namespace outlive::db {
class Connection;
class Pool;
}  // namespace outlive::db

namespace outlive::access {

class SqlChannels {
 public:
  SqlChannels(db::Pool& pool, Decisions& decisions, size_t max_keys,
              std::function<void(const std::string& app, double seconds)> on_authorize);

  // Decider::authorize() for a SQL channel: on a pool worker, `done` there too; at once (not ok)
  // when the pool has no room.
  void authorize(const std::string& app, const std::string& channel_name,
                 const config::Channel& channel, const std::string& key,
                 std::vector<std::string> viewer_ids, std::string viewers_json, uint64_t generation,
                 std::function<void(AuthorizeAnswer)> done, std::function<bool()> wanted);

  // Decider::authorize_viewer() for a SQL channel, for several keys of one viewer: each joined
  // with the other viewers asked for the same key, channel and generation (AuthorizeJoins); the
  // batches this starts run in one pool task, one after the other. `done` of each ask runs on a
  // pool worker, or at once (not ok) when the pool has no room.
  void authorize_viewer(const std::string& app, const std::string& channel_name,
                        const config::Channel& channel, const std::string& viewer_id,
                        const std::string& viewer_json, std::vector<ViewerAsk> asks,
                        std::function<bool()> wanted);

  // authorize(key, viewers), blocking, inside a pool task; caches the answers unless an access
  // update of `key` was read after `generation`.
  AuthorizeAnswer authorize_now(db::Connection& conn, const std::string& app,
                                const std::string& channel_name, const config::Channel& channel,
                                const std::string& key, const std::vector<std::string>& viewer_ids,
                                const std::string& viewers_json, uint64_t generation);

  // keys(scope, viewer) for each of a viewer's scopes on one channel (a socket's subs sent
  // together), the queries in one round trip: a FoundKeys per scope, in order, each at most
  // max_keys with the viewer's cached decisions. Blocking, inside a pool task; throws when one
  // query fails.
  std::vector<FoundKeys> find_keys(db::Connection& conn, const std::string& app,
                                   const std::string& channel_name, const config::Channel& channel,
                                   const std::vector<std::string>& scope_jsons,
                                   const std::string& viewer_json, const std::string& viewer_id);

 private:
  struct Started {
    AuthorizeJoins::Key key;
    const config::Channel* channel;
    std::shared_ptr<AuthorizeJoins::Batch> batch;
  };
  // One pool task runs `batches` in order; the batches they leave gathered go in another.
  void run(std::vector<Started> batches);
  void observe(const std::string& app, std::chrono::steady_clock::time_point started) const;

  db::Pool& pool_;
  Decisions& decisions_;
  const size_t max_keys_;
  const std::function<void(const std::string&, double)> on_authorize_;
  AuthorizeJoins joins_;
};

}  // namespace outlive::access
