// Channels declared as functions (SPEC 5.4 "A C++ embedding may declare them with functions
// instead", 5.5): a real in-process replica on a fresh PostgreSQL database and a real nats-server,
// whose code channels call the test's own "services" (a membership service reading Postgres on its
// own connections and answering from a thread of its own). Every wait has a deadline.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <outlive/channel.hpp>
#include <pqxx/pqxx>
#include <thread>

#include "common/error.hpp"
#include "outbox/live.hpp"
#include "config/config.hpp"
#include "replica/replica.hpp"
#include "support/channel_scenario.hpp"
#include "support/frames.hpp"
#include "support/inventory.hpp"
#include "support/services.hpp"
#include "support/sql.hpp"
#include "support/ws_client.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace outlive::testing::channels;
using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSchema = kInventoryTables + kAdaSeed + R"SQL(
INSERT INTO inventory.members VALUES ('00000000-0000-0000-0000-00000000000a', 'user:bob');
INSERT INTO auth.sessions VALUES
  (encode(sha256('bob-session'), 'hex'), 'user:bob', 'user:bob', false, now() + interval '1 hour'),
  (encode(sha256('carol-session'), 'hex'), 'user:carol', 'user:carol', false, now() + interval '1 hour');
)SQL";

// One thread that runs what it is given in order: the membership service answers from it, as a
// service called asynchronously would.
class Worker {
 public:
  Worker() : thread_([this] { run(); }) {}
  ~Worker() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void post(std::function<void()> f) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(f));
    }
    cv_.notify_all();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto f = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      f();
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// The application's own membership service: Postgres through its own connections, and switches
// the tests turn (fail, never answer), with a log of authorize calls.
struct Members {
  explicit Members(std::string db) : db(std::move(db)) {}

  std::optional<std::vector<std::string>> warehouse_keys(const json& scope) {
    pqxx::connection c(db);
    pqxx::work tx(c);
    const auto r = tx.exec_params("SELECT id::text FROM inventory.warehouses WHERE public_id = $1",
                                  scope.at("warehouse").get<std::string>());
    if (r.empty()) return std::nullopt;
    return std::vector<std::string>{r[0][0].as<std::string>()};
  }
  std::vector<std::string> my_warehouses(const json& viewer) {
    pqxx::connection c(db);
    pqxx::work tx(c);
    std::vector<std::string> keys;
    for (const auto& row : tx.exec_params(
             "SELECT warehouse_id::text FROM inventory.members WHERE subject = $1",
             viewer.at("accessSubject").get<std::string>()))
      keys.push_back(row[0].as<std::string>());
    return keys;
  }
  std::vector<std::string> members_among(const std::string& key, const json& viewers) {
    {
      std::lock_guard lock(mutex);
      calls.push_back(viewers.size());
    }
    pqxx::connection c(db);
    pqxx::work tx(c);
    std::vector<std::string> allowed;
    for (const auto& v : viewers) {
      const auto r = tx.exec_params(
          "SELECT 1 FROM inventory.members WHERE warehouse_id = $1::uuid AND subject = $2", key,
          v.at("accessSubject").get<std::string>());
      if (!r.empty()) allowed.push_back(v.at("id"));
    }
    return allowed;
  }

  const std::string db;
  std::mutex mutex;
  std::vector<size_t> calls;           // viewers per authorize call
  std::atomic<bool> fail{false};       // authorize of the "gate" channel throws
  std::atomic<bool> silent{false};     // authorize of the "gate" channel never answers
  std::vector<Reply<AllowedViewers>> unanswered;
  // The collection channel my_warehouses_code: how often its keys() ran, and the key of each of
  // its authorize() calls (guarded by `mutex`).
  std::atomic<int> collection_keys{0};
  std::vector<std::string> collection_authorized;
  size_t collection_authorized_count(const std::string& key) {
    std::lock_guard lock(mutex);
    return std::count(collection_authorized.begin(), collection_authorized.end(), key);
  }
  Worker worker;  // last: destroyed first, so nothing it runs outlives the rest
};

std::vector<CodeChannel> code_channels(Members& m) {
  const json any_scope = {{"type", "object"}, {"additionalProperties", false}};
  const json k_scope = {{"type", "object"},
                        {"properties", {{"k", {{"type", "string"}}}}},
                        {"required", {"k"}},
                        {"additionalProperties", false}};
  CodeChannel warehouse{"inventory", "warehouse_code", kWarehouseScopeSchema, false,
                        blocking_keys([&m](const json& scope, const json&) -> KeysResult {
                          return m.warehouse_keys(scope);
                        }),
                        // Answers later, from the service's own thread.
                        [&m](const std::string& key, const json& viewers,
                             Reply<AllowedViewers> reply) {
                          m.worker.post([&m, key, viewers, reply] {
                            try {
                              reply(m.members_among(key, viewers));
                            } catch (const std::exception& e) {
                              reply.fail(e.what());
                            }
                          });
                        }};
  CodeChannel mine{"inventory", "my_warehouses_code", any_scope, true,
                   blocking_keys([&m](const json&, const json& viewer) -> KeysResult {
                     ++m.collection_keys;
                     return m.my_warehouses(viewer);
                   }),
                   blocking_authorize([&m](const std::string& key, const json& viewers) {
                     {
                       std::lock_guard lock(m.mutex);
                       m.collection_authorized.push_back(key);
                     }
                     return m.members_among(key, viewers);
                   })};
  CodeChannel gate{"inventory", "gate", k_scope, false,
                   blocking_keys([](const json& scope, const json&) -> KeysResult {
                     return std::vector<std::string>{scope.at("k").get<std::string>()};
                   }),
                   [&m](const std::string&, const json& viewers, Reply<AllowedViewers> reply) {
                     if (m.fail) throw std::runtime_error("the membership service is down");
                     if (m.silent) {
                       std::lock_guard lock(m.mutex);
                       m.unanswered.push_back(reply);
                       return;
                     }
                     AllowedViewers all;
                     for (const auto& v : viewers) all.push_back(v.at("id"));
                     reply(std::move(all));
                   }};
  return {warehouse, mine, gate};
}

json config_json(const std::string& db, const std::string& nats) {
  json channels = {
      {"warehouse",
       {{"scope", kWarehouseScopeSchema}, {"keys", kWarehouseKeys}, {"authorize", kWarehouseAuthorize}}},
      {"my_warehouses",
       {{"collection", true},
        {"scope", {{"type", "object"}, {"additionalProperties", false}}},
        {"keys",
         "SELECT warehouse_id::text AS key FROM inventory.members WHERE subject = "
         "$2->>'accessSubject'"},
        {"authorize", kWarehouseAuthorize}}},
  };
  return inventory_replica_config(db, nats, "r1", channels);
}

struct Fixture {
  Fixture() : db(fresh_database()), members(db) {
    run_sql(db, kSchema);
    replica = std::make_unique<replica::Replica>(config::parse(config_json(db, nats.url())),
                                                 code_channels(members));
    REQUIRE(eventually([&] { return http_get(port(), "/readyz").first == 200; }, 30s, 20ms));
  }
  ~Fixture() { replica.reset(); }
  int port() const { return replica->port(); }
  WsClient open(const std::string& session) {
    return WsClient(port(), "/api/inventory/live", {{"Cookie", "session=" + session}});
  }
  void tx(const std::vector<std::string>& statements) { run_tx(db, statements); }

  std::string db;
  harness::EmbeddedNats nats;
  Members members;
  std::unique_ptr<replica::Replica> replica;
};

}  // namespace

TEST_CASE("code channels: not_found, a subset allowed, an access update, keys_changed") {
  Fixture f;
  const auto frames = scenario(f, "warehouse_code", "my_warehouses_code");
  INFO(json(frames).dump());
  REQUIRE(frames.size() == 10);
  CHECK(frames[0] == json{{"type", "subscribed"}, {"id", "w"}});                       // ada
  CHECK(frames[2]["type"] == "error");
  CHECK(frames[2]["code"] == "not_found");                                             // nowhere
  CHECK(frames[3]["code"] == "not_found");                                             // south
  CHECK(frames[5] == json{{"type", "revoked"}, {"id", "w"}, {"reason", "access_denied"}});  // bob
  CHECK(frames[6]["data"] == json{{"n", 1}});                                          // ada
  CHECK(frames[7]["reason"] == "keys_changed");                                        // carol
  CHECK(frames[8]["data"] == json{{"n", 2}});
  CHECK(frames[9]["data"] == json{{"n", 2}});
  // After the access update the dispatcher asked authorize once for both of north's readers.
  std::lock_guard lock(f.members.mutex);
  CHECK(std::find(f.members.calls.begin(), f.members.calls.end(), size_t(2)) !=
        f.members.calls.end());
}

TEST_CASE("a code collection after an access update: keys() again, keys_changed, authorize() again") {
  Fixture f;
  auto ada = f.open(kAdaToken);
  ada.send(sub("c", "my_warehouses_code").dump());
  frames_until(ada, "subscribed");  // keys {north}
  const int keys_at_sub = f.members.collection_keys;
  CHECK(keys_at_sub >= 1);
  CHECK(f.members.collection_authorized_count(kNorth) >= 1);

  // Ada joins south: the access update makes keys() run again, its answer {north, south} differs,
  // so the collection resyncs, and the new key's decision comes from the code authorize().
  f.tx({member_sql(true, kSouth, "user:ada"), access_sql(kSouth)});
  const auto joined = frames_until(ada, "resync");
  INFO(json(joined).dump());
  CHECK(joined.back() == json{{"type", "resync"}, {"id", "c"}, {"reason", "keys_changed"}});
  CHECK(f.members.collection_keys > keys_at_sub);
  CHECK(f.members.collection_authorized_count(kSouth) >= 1);
  f.tx({publish_sql(kSouth, {{"n", 1}})});
  CHECK(frames_until(ada, "update").back()["data"] == json{{"n", 1}});  // south is followed now

  // An access update of north that changes nothing for ada: keys() runs again with the same
  // answer (no resync), and north's decision, dropped by the access update, is asked again of the
  // code authorize() before anything of north reaches her.
  const int keys_before = f.members.collection_keys;
  const size_t north_before = f.members.collection_authorized_count(kNorth);
  f.tx({access_sql(kNorth)});
  CHECK(eventually([&] { return f.members.collection_keys > keys_before; }, 10s, 10ms));
  f.tx({publish_sql(kNorth, {{"n", 2}})});
  const auto after = frames_until(ada, "update");
  INFO(json(after).dump());
  CHECK(after.size() == 1);  // no resync, no revoked before the update
  CHECK(after.back()["data"] == json{{"n", 2}});
  CHECK(f.members.collection_authorized_count(kNorth) > north_before);
}

TEST_CASE("an SQL channel and the equivalent code channel give the same frames") {
  std::vector<json> sql, code;
  {
    Fixture f;
    sql = scenario(f, "warehouse", "my_warehouses");
  }
  {
    Fixture f;
    code = scenario(f, "warehouse_code", "my_warehouses_code");
  }
  CHECK(json(sql).dump() == json(code).dump());
}

TEST_CASE("a code authorize that throws closes 1011 and the tab resumes without a gap") {
  Fixture f;
  auto ws = f.open(kAdaToken);
  std::string cursor;
  ws.send(sub("g", "gate", {{"k", "boom"}}).dump());
  frames_until(ws, "subscribed", &cursor);
  f.members.fail = true;
  f.tx({access_sql("boom"), publish_sql("boom", {{"n", 1}})});
  CHECK(ws.wait_closed(15s) == 1011);
  f.members.fail = false;
  auto again = f.open(kAdaToken);
  again.send(sub("g", "gate", {{"k", "boom"}}, cursor).dump());
  const auto frames = frames_until(again, "update");
  INFO(json(frames).dump());
  CHECK(frames.front()["type"] == "subscribed");
  CHECK(frames.back()["data"] == json{{"n", 1}});
}

TEST_CASE("a code authorize that never answers closes 1011 after 10 s") {
  Fixture f;
  auto ws = f.open(kAdaToken);
  ws.send(sub("g", "gate", {{"k", "quiet"}}).dump());
  frames_until(ws, "subscribed");
  f.members.silent = true;
  const auto start = Clock::now();
  f.tx({access_sql("quiet"), publish_sql("quiet", {{"n", 1}})});
  CHECK(ws.wait_closed(20s) == 1011);
  const double after = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK(after > 9.0);
  CHECK(after < 15.0);
  std::lock_guard lock(f.members.mutex);
  CHECK(!f.members.unanswered.empty());  // asked, never answered (once per update waiting)
}

TEST_CASE("a replica refuses code channels of an app its configuration does not list") {
  const std::string db = fresh_database();
  run_sql(db, kSchema);
  harness::EmbeddedNats nats;
  Members members(db);
  auto channels = code_channels(members);
  channels[0].app = "billing";
  try {
    replica::Replica r(config::parse(config_json(db, nats.url())), channels);
    FAIL("the replica started");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_input);
    CHECK(std::string(e.what()).find("does not list app \"billing\"") != std::string::npos);
  }
  channels = code_channels(members);
  channels[0].name = "warehouse";  // declared by the configuration already
  CHECK_THROWS_AS(replica::Replica(config::parse(config_json(db, nats.url())), channels), Error);
}

TEST_CASE("cursor() read before the snapshot: an update committed in between comes after subscribed, once or twice, never lost") {
  Fixture f;
  outlive::LiveDefinition live("inventory", {{"type", "object"}});
  CHECK_THROWS_AS(live.cursor(), Error);  // no topic yet
  live.use_topic({f.nats.url()});
  const std::string cursor = live.cursor();  // server-side rendering: the cursor first...
  {
    pqxx::connection conn(f.db);
    pqxx::work tx(conn);
    live.publish(tx, {kNorth, {{"n", 1}}});  // ...a change while the snapshot loads...
    tx.commit();
    live.wake(conn);
  }
  // ...the snapshot (it may or may not hold the change), then the tab subscribes from the cursor.
  auto ada = f.open(kAdaToken);
  ada.send(sub("w", "warehouse_code", kNorthScope, cursor).dump());
  std::vector<json> frames = frames_until(ada, "subscribed");
  // A marker committed after `subscribed`: everything before it has been delivered once it comes,
  // so counting the change's copies up to the marker tells "lost" from "late".
  f.tx({publish_sql(kNorth, {{"n", 2}})});
  for (;;) {
    const auto more = frames_until(ada, "update");
    frames.insert(frames.end(), more.begin(), more.end());
    if (frames.back()["data"] == json{{"n", 2}}) break;
  }
  INFO(json(frames).dump());
  CHECK(frames.front()["type"] == "subscribed");
  long copies = 0;
  for (const auto& j : frames) {
    CHECK(j["type"] != "resync");  // the cursor is within the window: nothing to reload
    if (j["type"] == "update" && j["data"] == json{{"n", 1}}) ++copies;
  }
  // Once, or twice when the change comes both through the replay and the live feed (SPEC 5.6:
  // "possibly twice: apply idempotently"); never zero.
  CHECK(copies >= 1);
  CHECK(copies <= 2);
}
