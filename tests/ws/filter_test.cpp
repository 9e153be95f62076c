// Subscription filters end to end (SPEC 5.2 rev 3): a real in-process replica (publisher, window,
// websocket server) on a fresh PostgreSQL database and a real nats-server, driven by real websocket
// clients. Live delivery, replay from a cursor and catch-up from the window each apply the filter;
// progress covers what it refused; access updates, resync and revoked pass it. Every wait has a
// deadline.
#include <catch2/catch.hpp>

#include <optional>
#include <pqxx/pqxx>
#include <vector>

#include "config/config.hpp"
#include "replica/replica.hpp"
#include "support/frames.hpp"
#include "support/inventory.hpp"
#include "support/services.hpp"
#include "support/ws_client.hpp"
#include "topic/client.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSchema = kInventoryTables + kAdaSeed + R"SQL(
INSERT INTO inventory.members VALUES ('00000000-0000-0000-0000-00000000000b', 'user:ada');
)SQL";

const std::string kWindowUpdates = R"(outlive_window_updates{app="inventory"})";
const std::string kCatchUps = R"(outlive_catch_ups_total{app="inventory"})";

struct Fixture {
  Fixture() : db(fresh_database()) {
    {
      pqxx::connection c(db);
      pqxx::work tx(c);
      tx.exec(kSchema);
      tx.commit();
    }
    topic = std::make_unique<topic::Client>(std::vector<std::string>{nats.url()},
                                            "outlive-filter-tests");
    json channels = {{"warehouse",
                      {{"scope", kWarehouseScopeSchema},
                       {"keys", kWarehouseKeys},
                       {"authorize", kWarehouseAuthorize}}}};
    json c = inventory_replica_config(db, nats.url(), "r1", channels);
    // Progress whenever the topic moved: the tests read "progress for the rest" at each tick.
    c["server"] = {{"progress_after_updates", 1}};
    replica = std::make_unique<replica::Replica>(config::parse(c));
    REQUIRE(eventually([&] { return http_get(port(), "/readyz").first == 200; }, 30s, 20ms));
  }

  int port() const { return replica->port(); }

  WsClient open(int receive_buffer = 0) {
    return WsClient(port(), "/api/inventory/live", {{"Cookie", kAdaCookie}}, "127.0.0.1",
                    receive_buffer);
  }

  void sql(const std::vector<std::string>& statements) {
    pqxx::connection c(db);
    pqxx::work tx(c);
    for (const auto& s : statements) tx.exec(s);
    tx.commit();
    pqxx::nontransaction(c).exec("SELECT events.wake('inventory')");
  }

  void publish(const std::string& key, const json& data) {
    pqxx::connection c(db);
    sql({"SELECT events.publish_live('inventory', " + c.quote(key) + ", " + c.quote(data.dump()) +
         "::jsonb)"});
  }

  // Updates i = from..to in one transaction (key and data are SQL expressions of i).
  void publish_series(int64_t from, int64_t to, const std::string& key_sql,
                      const std::string& data_sql) {
    sql({"SELECT events.publish_live('inventory', " + key_sql + ", " + data_sql +
         ") FROM generate_series(" + std::to_string(from) + ", " + std::to_string(to) + ") i"});
  }

  // Every committed update is on the topic and in the replica's window; returns the topic's head.
  uint64_t wait_published() {
    pqxx::connection c(db);
    REQUIRE(eventually(
        [&] {
          return pqxx::nontransaction(c)
                     .exec("SELECT count(*) FROM events.outbox")[0][0]
                     .as<int64_t>() == 0;
        },
        60s, 20ms));
    const uint64_t head = topic->stream_state("inventory").last_sequence;
    REQUIRE(eventually([&] { return metric(port(), kWindowUpdates) >= double(head); }, 10s, 20ms));
    return head;
  }

  std::string db;
  harness::EmbeddedNats nats;
  std::unique_ptr<topic::Client> topic;
  std::unique_ptr<replica::Replica> replica;
};

json sub(const std::string& id, const json& scope, const json& filter,
         const std::optional<std::string>& cursor = std::nullopt) {
  json m = {{"type", "sub"}, {"id", id}, {"channel", "warehouse"}, {"scope", scope}};
  if (!filter.is_null()) m["filter"] = filter;
  if (cursor) m["cursor"] = *cursor;
  return m;
}

// The update frames that arrive until a progress frame (or an update) reaches `position`; any other
// frame, a close or the deadline fails the test. Progress never passes an update not sent yet, so
// every update up to `position` for this socket is in what it returns.
std::vector<json> updates_through(WsClient& ws, uint64_t position,
                                  std::chrono::milliseconds timeout = 30s) {
  std::vector<json> out;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0)
      FAIL("no progress to " << position << " in time, " << out.size() << " updates");
    auto r = ws.next(left);
    if (r.timed_out)
      FAIL("no progress to " << position << " in time, " << out.size() << " updates");
    if (r.closed)
      FAIL("socket closed with " << r.close_code << " after " << out.size() << " updates");
    auto j = r.json();
    if (j["type"] == "progress") {
      if (position_of(j["cursor"]) >= position) return out;
      continue;
    }
    if (j["type"] != "update") FAIL("unexpected frame: " << r.text.substr(0, 300));
    const uint64_t at = position_of(j["cursor"]);
    out.push_back(std::move(j));
    if (at >= position) return out;  // the tab knows it is there: no progress frame follows
  }
}

std::vector<int64_t> numbers_of(const std::vector<json>& updates) {
  std::vector<int64_t> ns;
  for (const auto& u : updates) ns.push_back(u["data"]["n"].get<int64_t>());
  return ns;
}

std::vector<int64_t> every(int64_t step, int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i <= to; i += step) v.push_back(i);
  return v;
}

void check_positions_increase(const std::vector<json>& updates) {
  uint64_t last = 0;
  for (const auto& u : updates) {
    const uint64_t p = position_of(u["cursor"]);
    CHECK(p > last);
    last = p;
  }
}

// Update number i: n = i, op "deleted" for every 3rd (else "changed"), shelf i % 2.
const std::string kOpSql =
    "jsonb_build_object('n', i, 'op', CASE WHEN i % 3 = 0 THEN 'deleted' ELSE 'changed' END, "
    "'shelf', i % 2)";

}  // namespace

TEST_CASE(
    "a filtered subscription receives exactly the updates that match, in order, and progress for "
    "the rest") {
  Fixture f;
  auto deletions = f.open();
  deletions.send(sub("d", kNorthScope, {{"op", "deleted"}}).dump());
  REQUIRE(next_frame(deletions)["type"] == "subscribed");
  // Two subscriptions of one socket on the same key: a frame lists only those it is for.
  auto both = f.open();
  both.send(sub("all", kNorthScope, nullptr).dump());
  REQUIRE(next_frame(both)["type"] == "subscribed");
  both.send(sub("even", kNorthScope, {{"op", "deleted"}, {"shelf", 0}}).dump());
  REQUIRE(next_frame(both)["type"] == "subscribed");

  f.publish_series(0, 0, "'" + kSouth + "'", kOpSql);  // a key nobody here follows
  f.publish_series(1, 20, "'" + kNorth + "'", kOpSql);
  const uint64_t head = f.wait_published();

  // 20, the topic's head, is not a deletion: the socket hears of the positions past 18 only
  // through progress.
  const auto got = updates_through(deletions, head);
  CHECK(numbers_of(got) == every(3, 3, 18));
  check_positions_increase(got);
  for (const auto& u : got) CHECK(u["ids"] == json{"d"});

  const auto mixed = updates_through(both, head);
  CHECK(numbers_of(mixed) == every(1, 1, 20));
  for (const auto& u : mixed) {
    const int64_t n = u["data"]["n"];
    INFO("n = " << n);
    CHECK(u["ids"] == (n % 6 == 0 ? json{"all", "even"} : json{"all"}));
  }

  // Still live afterwards, and the filter still applies.
  f.publish(kNorth, {{"n", 22}, {"op", "changed"}});
  f.publish(kNorth, {{"n", 23}, {"op", "deleted"}});
  CHECK(numbers_of(updates_through(deletions, f.wait_published())) == std::vector<int64_t>{23});
}

TEST_CASE("a replay from a cursor applies the filter") {
  Fixture f;
  auto ws = f.open();
  ws.send(sub("d", kNorthScope, nullptr).dump());
  const std::string cursor = next_frame(ws)["cursor"];
  ws.close();
  f.publish_series(1, 30, "'" + kNorth + "'", kOpSql);
  f.publish_series(31, 40, "'" + kSouth + "'", kOpSql);
  const uint64_t head = f.wait_published();

  auto back = f.open();
  back.send(sub("d", kNorthScope, {{"op", "deleted"}, {"shelf", 1}}, cursor).dump());
  const auto subscribed = next_frame(back);
  REQUIRE(subscribed["type"] == "subscribed");
  CHECK(subscribed["cursor"] == cursor);
  const auto got = updates_through(back, head);
  CHECK(numbers_of(got) == every(6, 3, 27));  // odd multiples of 3
  check_positions_increase(got);
  // Live after the replay, filtered the same.
  f.publish(kNorth, {{"n", 41}, {"op", "deleted"}, {"shelf", 0}});
  f.publish(kNorth, {{"n", 42}, {"op", "deleted"}, {"shelf", 1}});
  CHECK(numbers_of(updates_through(back, f.wait_published())) == std::vector<int64_t>{42});
}

TEST_CASE("a reader that falls behind catches up from the window through its filter") {
  // SPEC 5.7 rev 2: the slow reader's send buffer fills (120 matching updates of 8 KiB, 960 KiB,
  // past its 256 KiB) while it reads nothing; it leaves live delivery and is fed from the window.
  Fixture f;
  const double catch_ups_before = metric_or_zero(f.port(), kCatchUps);
  auto slow = f.open(/*receive_buffer=*/4096);
  slow.send(sub("odd", kNorthScope, {{"odd", true}}).dump());
  REQUIRE(next_frame(slow)["type"] == "subscribed");
  f.publish_series(1, 240, "'" + kNorth + "'",
                   "jsonb_build_object('n', i, 'odd', i % 2 = 1, 'blob', repeat('x', 8192))");
  const uint64_t head = f.wait_published();
  REQUIRE(eventually([&] { return metric_or_zero(f.port(), kCatchUps) > catch_ups_before; }, 10s,
                     20ms));
  const auto got = updates_through(slow, head, 60s);
  CHECK(numbers_of(got) == every(2, 1, 239));
  check_positions_increase(got);
  CHECK(metric_or_zero(f.port(), R"(outlive_socket_closes_total{code="1013"})") == 0);
}

TEST_CASE("an invalid filter is invalid_message for its id and the socket stays") {
  Fixture f;
  auto ws = f.open();
  json nine = json::object();
  for (int i = 0; i < 9; ++i) nine["f" + std::to_string(i)] = i;
  const std::vector<std::pair<std::string, json>> invalid = {
      {"nested", {{"op", {{"is", "deleted"}}}}},
      {"list", {{"op", json::array({"deleted"})}}},
      {"nine", nine},
      {"string", "deleted"},
  };
  for (const auto& [id, filter] : invalid) {
    INFO(id);
    ws.send(sub(id, kNorthScope, filter).dump());
    const auto e = next_frame(ws);
    CHECK(e["type"] == "error");
    CHECK(e["code"] == "invalid_message");
    CHECK(e["id"] == id);
  }
  // The same socket, 8 fields: accepted, and an update equal on all of them arrives.
  json eight = json::object();
  for (int i = 0; i < 8; ++i) eight["f" + std::to_string(i)] = i;
  ws.send(sub("nine", kNorthScope, eight).dump());
  REQUIRE(next_frame(ws)["type"] == "subscribed");
  json data = eight;
  data["n"] = 1;
  f.publish(kNorth, data);
  data["f7"] = 8;
  data["n"] = 2;
  f.publish(kNorth, data);
  CHECK(numbers_of(updates_through(ws, f.wait_published())) == std::vector<int64_t>{1});
}

TEST_CASE("resync and revoked reach a filtered subscription whatever its filter") {
  Fixture f;
  auto ws = f.open();
  ws.send(sub("d", kNorthScope, {{"op", "deleted"}}).dump());
  REQUIRE(next_frame(ws)["type"] == "subscribed");
  // Oversized data (33 KiB) becomes a resync, which the filter does not hold back.
  f.publish(kNorth, {{"op", "changed"}, {"blob", std::string(33 * 1024, 'x')}});
  const auto resync = next_frame(ws);
  CHECK(resync["type"] == "resync");
  CHECK(resync["id"] == "d");
  CHECK(resync["reason"] == "oversized");
  // Ada leaves north: the access update ends the subscription, data of no interest to it or not.
  f.sql({"DELETE FROM inventory.members WHERE warehouse_id = '" + kNorth + "'",
         "SELECT events.publish_live('inventory', '" + kNorth + "', NULL, true)",
         "SELECT events.publish_live('inventory', '" + kNorth + R"(', '{"op":"changed"}'))"});
  const auto revoked = next_frame(ws);
  CHECK(revoked["type"] == "revoked");
  CHECK(revoked["id"] == "d");
  CHECK(revoked["reason"] == "access_denied");
}
