// The websocket replica end to end: a real replica (publisher, window, server) on real PostgreSQL
// and nats-server, driven by a real websocket client.
#include <sys/wait.h>
#include <catch2/catch.hpp>
#include <csignal>
#include <pqxx/pqxx>

#include "common/error.hpp"
#include "config/config.hpp"
#include "harness/process.hpp"
#include "replica/replica.hpp"
#include "support/frames.hpp"
#include "support/inventory.hpp"
#include "support/raw_ws.hpp"
#include "support/replica_fixture.hpp"
#include "support/serve_child.hpp"
#include "support/services.hpp"
#include "support/ws_client.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

const std::string kSchema = kInventoryTables + kAdaSeed + R"SQL(
INSERT INTO inventory.members VALUES ('00000000-0000-0000-0000-00000000000b', 'user:ada'),
                                     ('00000000-0000-0000-0000-00000000000a', 'user:bob');
INSERT INTO auth.sessions VALUES
  (encode(sha256('ada-phone'), 'hex'), 'user:ada', 'user:ada', true, now() + interval '1 hour'),
  (encode(sha256('bob-session'), 'hex'), 'user:bob', 'user:bob', false, now() + interval '1 hour'),
  (encode(sha256('old-session'), 'hex'), 'user:ada', 'user:ada', false, now() - interval '1 minute');
INSERT INTO auth.api_keys VALUES
  (encode(sha256('ada-key'), 'hex'), 'user:ada', 'user:ada', '{write,read}', NULL),
  (encode(sha256('ci-key'), 'hex'), 'service_account:ci', 'service_account:ci', '{read}', NULL);
INSERT INTO auth.oauth_tokens VALUES
  (encode(sha256('ada-oauth'), 'hex'), 'user:ada', 'user:ada', '{read}', now() + interval '1 hour');
)SQL";

json config_json(const std::string& db, const std::string& nats, int recheck_seconds = 60) {
  json channels = {
      {"warehouse",
       {{"scope", kWarehouseScopeSchema},
        {"keys", kWarehouseKeys},
        {"authorize", kWarehouseAuthorize}}},
      {"my_warehouses",
       {{"collection", true},
        {"scope", {{"type", "object"}, {"additionalProperties", false}}},
        {"keys",
         "SELECT warehouse_id::text AS key FROM inventory.members WHERE subject = "
         "$2->>'accessSubject'"},
        {"authorize", kWarehouseAuthorize}}},
      // Follows the viewer's own id as its key: shows which viewer id the replica derived.
      {"me",
       {{"scope", {{"type", "object"}}},
        {"keys", "SELECT $2->>'id' AS key"},
        {"authorize",
         "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v WHERE v->>'id' = $1"}}},
      {"many",
       {{"collection", true},
        {"scope", {{"type", "object"}}},
        {"keys", "SELECT 'm' || i AS key FROM generate_series(1, 1001) i ORDER BY i"},
        {"authorize", "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v"}}},
      {"broken",
       {{"scope", {{"type", "object"}}},
        {"keys", "SELECT 'b' AS key"},
        {"authorize", "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v WHERE 1/0 = 1"}}},
  };
  return inventory_replica_config(db, nats, "r1", channels, recheck_seconds);
}

struct Fixture : ReplicaFixture {
  // `server`: the config's "server" section, when given.
  explicit Fixture(int recheck_seconds = 60, const json& server = nullptr)
      : ReplicaFixture(kSchema, [&](const std::string& db, const std::string& nats) {
          json config = config_json(db, nats, recheck_seconds);
          if (!server.is_null()) config["server"] = server;
          return config;
        }) {}

  WsClient open(const std::vector<std::pair<std::string, std::string>>& headers = {{"Cookie",
                                                                                    kAdaCookie}},
                const std::string& app = "inventory") {
    return WsClient(port, "/api/" + app + "/live", headers);
  }
};

json sub(const std::string& id, const std::string& channel, const json& scope = json::object()) {
  return json{{"type", "sub"}, {"id", id}, {"channel", channel}, {"scope", scope}};
}

json expect_error(WsClient& ws, const std::string& code) {
  auto e = ws.next_of_type("error");
  CHECK(e["code"] == code);
  return e;
}

void expect_refused(WsClient ws, const std::string& code, int close_code = 1008) {
  expect_error(ws, code);
  CHECK(ws.wait_closed() == close_code);
}

}  // namespace

TEST_CASE("health, readiness, metrics and the cursor endpoint") {
  Fixture f;
  CHECK(http_get(f.port, "/healthz") == std::make_pair(200, std::string("ok\n")));
  CHECK(http_get(f.port, "/readyz").first == 200);
  const auto [status, body] = http_get(f.port, "/api/inventory/live/cursor");
  CHECK(status == 200);
  CHECK(json::parse(body)["cursor"].get<std::string>().size() <= 64);
  CHECK(http_get(f.port, "/api/nope/live/cursor").first == 404);
  CHECK(http_get(f.port, "/elsewhere").first == 404);
  const auto metrics = http_get(f.port, "/metrics").second;
  for (const char* name :
       {"outlive_outbox_pending", "outlive_published_total", "outlive_window_updates",
        "outlive_publish_errors_total", "outlive_window_bytes"}) {
    CHECK_THAT(metrics, Catch::Contains(name));
  }
}

TEST_CASE("the outbox gauges are refreshed over one kept connection") {
  // A connection per refresh would cost Postgres a backend's start and exit every 5 s.
  Fixture f;
  pqxx::connection c(f.db);
  const auto gauges_backend = [&] {
    const auto r = pqxx::nontransaction(c).exec(
        "SELECT pid, backend_start::text, query_start::text FROM pg_stat_activity WHERE "
        "application_name = 'outlive-gauges' AND datname = current_database()");
    return r.empty() ? std::vector<std::string>{}
                     : std::vector<std::string>{r[0][0].c_str(), r[0][1].c_str(), r[0][2].c_str()};
  };
  std::vector<std::string> first;
  REQUIRE(eventually([&] { return !(first = gauges_backend()).empty(); }, 10s, 20ms));
  std::vector<std::string> later;
  REQUIRE(eventually(
      [&] {
        later = gauges_backend();
        return later.empty() || later[2] != first[2];  // gone, or it ran the next refresh
      },
      15s, 50ms));
  REQUIRE(!later.empty());
  CHECK(later[0] == first[0]);  // the same backend
  CHECK(later[1] == first[1]);
}

TEST_CASE("malloc's view on /metrics is sampled in the background, not by the scrape") {
  // mallinfo2() walks every free chunk under each arena's lock (10-20 ms with 5,000 sockets): on
  // the io thread serving the scrape it held back that thread's sockets.
  Fixture f;
  const auto age = [&] { return metric(f.port, "outlive_heap_sample_age_seconds"); };
  REQUIRE(eventually([&] { return age() >= 0; }, 10s, 50ms));
  CHECK(age() <= 15);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // (the sanitizers' allocator replaces malloc's: mallinfo2() sees nothing)
  CHECK(metric(f.port, "outlive_heap_bytes{state=\"in_use\"}") >= 0);
#else
  CHECK(metric(f.port, "outlive_heap_bytes{state=\"in_use\"}") > 0);
#endif
  CHECK(metric(f.port, "outlive_heap_bytes{state=\"free\"}") >= 0);
  // A sample taken by the scrape would always be fresh: scrapes see it age...
  double last = age();
  REQUIRE(eventually([&] { return (last = age()) >= 1.0; }, 12s, 100ms));
  // ...until the next one, within the period (10 s).
  REQUIRE(eventually(
      [&] {
        const double now = age();
        const bool renewed = now < last;
        last = now;
        return renewed;
      },
      15s, 100ms));
  CHECK(last < 1.0);
}

TEST_CASE("a session socket subscribes and receives an update of its key") {
  Fixture f;
  auto ws = f.open();
  ws.send(sub("w1", "warehouse", {{"warehouse", "north"}}).dump());
  const auto subscribed = ws.next_of_type("subscribed");
  CHECK(subscribed["id"] == "w1");
  f.publish(kNorth, {{"type", "item.changed"}, {"itemId", "i1"}});
  const auto update = ws.next_of_type("update", 10s);
  CHECK(update["ids"] == json{"w1"});
  CHECK(update["key"] == kNorth);
  CHECK(update["data"] == json{{"type", "item.changed"}, {"itemId", "i1"}});
  CHECK(update["cursor"].get<std::string>() != subscribed["cursor"].get<std::string>());
  // unsub: nothing more arrives for it; an unknown id is not_found.
  ws.send(R"({"type":"unsub","id":"w1"})");
  ws.send(R"({"type":"unsub","id":"w1"})");
  CHECK(expect_error(ws, "not_found")["id"] == "w1");
}

TEST_CASE("the three credential kinds and the viewer ids they produce") {
  Fixture f;
  const std::vector<std::pair<std::vector<std::pair<std::string, std::string>>, std::string>>
      cases = {
          {{{"Cookie", "theme=dark; " + kAdaCookie}}, "user:ada"},
          {{{"Cookie", "session=ada-phone"}}, "user:ada:app"},
          {{{"Authorization", "Bearer ada-key"}}, "user:ada:read,write"},
          {{{"Authorization", "Bearer ci-key"}}, "service_account:ci:read"},
          {{{"Authorization", "Bearer ada-oauth"}}, "user:ada:read"},
      };
  for (const auto& [headers, viewer_id] : cases) {
    INFO(viewer_id);
    auto ws = f.open(headers);
    ws.send(sub("me", "me").dump());
    ws.next_of_type("subscribed");
    f.publish(viewer_id, {{"type", "item.changed"}, {"itemId", viewer_id}});
    const auto update = ws.next_of_type("update");
    CHECK(update["key"] == viewer_id);
  }
}

TEST_CASE("refused sockets get an error frame and close 1008") {
  Fixture f;
  expect_refused(f.open({}), "unauthorized");
  expect_refused(f.open({{"Cookie", "session=nope"}}), "unauthorized");
  expect_refused(f.open({{"Authorization", "Bearer nope"}}), "unauthorized");
  expect_refused(f.open({{"Cookie", "session=old-session"}}), "unauthorized");  // expired
  expect_refused(f.open({{"Cookie", kAdaCookie}, {"Origin", "https://evil.example"}}),
                 "forbidden_origin");
  expect_refused(f.open({{"Cookie", kAdaCookie}}, "nope"), "unknown_app");
  // An allowed Origin, and no Origin (not a browser), are served.
  auto allowed = f.open({{"Cookie", kAdaCookie}, {"Origin", "http://localhost:8080"}});
  allowed.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
  allowed.next_of_type("subscribed");
  // A Bearer credential with a foreign Origin is not a cookie socket: served.
  auto bearer = f.open({{"Authorization", "Bearer ada-key"}, {"Origin", "https://evil.example"}});
  bearer.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
  bearer.next_of_type("subscribed");
}

TEST_CASE("bad input is refused with the documented error and the socket stays") {
  Fixture f;
  auto ws = f.open();
  ws.send("not json");
  expect_error(ws, "invalid_message");
  ws.send_binary("\x01\x02");
  expect_error(ws, "invalid_message");
  ws.send(R"({"type":"publish","id":"x"})");
  CHECK(expect_error(ws, "invalid_message")["id"] == "x");
  ws.send(R"({"type":"sub","channel":"warehouse"})");
  expect_error(ws, "invalid_message");
  ws.send(sub("w", "nope").dump());
  CHECK(expect_error(ws, "unknown_channel")["id"] == "w");
  ws.send(sub("w", "warehouse", {{"warehouse", "nowhere"}}).dump());
  CHECK(expect_error(ws, "not_found")["id"] == "w");
  ws.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
  ws.next_of_type("subscribed");
  ws.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
  CHECK(expect_error(ws, "duplicate_id")["id"] == "w");
  ws.send(sub("b", "broken").dump());  // authorize raises an error: 1011, the tab retries
  CHECK(ws.wait_closed() == 1011);
}

TEST_CASE("16 subscriptions per socket and the 17th is refused") {
  Fixture f;
  auto ws = f.open();
  for (int i = 0; i < 16; ++i)
    ws.send(sub("s" + std::to_string(i), "warehouse", {{"warehouse", "north"}}).dump());
  for (int i = 0; i < 16; ++i)
    CHECK(ws.next_of_type("subscribed")["id"] == "s" + std::to_string(i));
  ws.send(sub("s16", "warehouse", {{"warehouse", "north"}}).dump());
  CHECK(expect_error(ws, "too_many_subscriptions")["id"] == "s16");
  ws.send(R"({"type":"unsub","id":"s0"})");
  ws.send(sub("s16", "warehouse", {{"warehouse", "north"}}).dump());
  CHECK(ws.next_of_type("subscribed")["id"] == "s16");
}

TEST_CASE("more than 24 waiting messages: reading pauses and nothing is dropped") {
  Fixture f;
  auto ws = f.open();
  // 40 messages at once, each needing a database check: every one is answered, in order.
  for (int i = 0; i < 40; ++i) {
    ws.send(i % 2 == 0
                ? sub("s" + std::to_string(i / 2), "warehouse", {{"warehouse", "north"}}).dump()
                : json{{"type", "unsub"}, {"id", "s" + std::to_string(i / 2)}}.dump());
  }
  for (int i = 0; i < 20; ++i)
    CHECK(ws.next_of_type("subscribed")["id"] == "s" + std::to_string(i));
  // Every unsub found its sub: no not_found errors were sent.
  ws.send(sub("last", "warehouse", {{"warehouse", "north"}}).dump());
  auto r = ws.next();
  REQUIRE_FALSE(r.closed);
  CHECK(r.json()["type"] == "subscribed");
}

TEST_CASE("an invalid scope ends the socket with 1008") {
  Fixture f;
  auto ws = f.open();
  ws.send(sub("w", "warehouse", {{"warehouse", 7}}).dump());
  CHECK(expect_error(ws, "invalid_scope")["id"] == "w");
  CHECK(ws.wait_closed() == 1008);
}

TEST_CASE("a message of 16 KiB is read and 16 KiB + 1 closes with 1009") {
  Fixture f;
  auto ws = f.open();
  auto padded = [](size_t size) {
    json m = {{"type", "unsub"}, {"id", "x"}, {"pad", ""}};
    const size_t base = m.dump().size();
    m["pad"] = std::string(size - base, 'p');
    return m.dump();
  };
  ws.send(padded(16 * 1024));
  CHECK(expect_error(ws, "not_found")["id"] == "x");
  ws.send(padded(16 * 1024 + 1));
  CHECK(ws.wait_closed() == 1009);
}

TEST_CASE("websocket frames: fragments and pings are read and a close is answered with its code") {
  Fixture f;
  RawWs ws(f.port, "/api/inventory/live", "Authorization: Bearer ada-key\r\n");
  // One sub in three fragments with a ping between them, all in one TCP write.
  const std::string text = sub("w", "warehouse", {{"warehouse", "north"}}).dump();
  ws.send_raw(client_frame(0x1, text.substr(0, 10), false) + client_frame(0x9, "are you there") +
              client_frame(0x0, text.substr(10, 20), false) + client_frame(0x0, text.substr(30)));
  auto pong = ws.next();
  REQUIRE(pong);
  CHECK(pong->opcode == 0xA);
  CHECK(pong->payload == "are you there");
  std::optional<ServerFrame> frame;
  do {
    frame = ws.next();
    REQUIRE(frame);
  } while (frame->opcode == 0x1 && json::parse(frame->payload)["type"] == "progress");
  REQUIRE(frame->opcode == 0x1);
  CHECK(json::parse(frame->payload)["type"] == "subscribed");
  // The tab closes with 4000: the server answers with 4000 and ends the connection.
  ws.send_raw(client_frame(0x8, std::string("\x0f\xa0", 2) + "bye"));
  do {
    frame = ws.next();
    REQUIRE(frame);
  } while (frame->opcode != 0x8);
  CHECK(frame->close_code() == 4000);
  CHECK(ws.wait_eof(5s));
}

TEST_CASE("broken websocket frames close at once with 1002 or 1007 and the replica serves on") {
  Fixture f;
  struct Case {
    const char* what;
    std::string bytes;
    uint16_t code;
  };
  const std::vector<Case> cases{
      {"unmasked", client_frame(0x1, "{}", true, false), 1002},
      {"reserved bits", client_frame(0x1, "{}", true, true, 0x40), 1002},
      {"a continuation first", client_frame(0x0, "{}"), 1002},
      {"text that is not UTF-8", client_frame(0x1, "\xC0\x80"), 1007},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    RawWs ws(f.port, "/api/inventory/live", "Authorization: Bearer ada-key\r\n");
    ws.send_raw(c.bytes);
    std::optional<ServerFrame> frame;
    do {
      frame = ws.next();
      REQUIRE(frame);
    } while (frame->opcode != 0x8);
    CHECK(frame->close_code() == c.code);
    // Dropped without waiting for the tab's answer (the close timer would take 10 s).
    CHECK(ws.wait_eof(3s));
  }
  auto ws = f.open();
  ws.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
  ws.next_of_type("subscribed");
}

TEST_CASE("a collection follows at most 1,000 keys") {
  Fixture f;
  auto ws = f.open();
  ws.send(sub("m", "many").dump());
  ws.next_of_type("subscribed");
  f.publish("m1001", {{"n", 1001}});
  f.publish("m1000", {{"n", 1000}});
  const auto update = ws.next_of_type("update");
  CHECK(update["key"] == "m1000");  // m1001 was not followed
}

TEST_CASE("5 opens per second per person, and per client address for API keys") {
  Fixture f;
  // A person: 6 cookie sockets opened at once from different addresses: whatever order their
  // checks finish in, 5 are served and one is refused.
  std::vector<WsClient> sockets;
  for (int i = 0; i < 6; ++i) {
    sockets.emplace_back(f.port, "/api/inventory/live",
                         std::vector<std::pair<std::string, std::string>>{{"Cookie", kAdaCookie}},
                         "127.0.0." + std::to_string(i + 1));
  }
  int served = 0, limited = 0;
  for (auto& ws : sockets) {
    ws.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
    const auto j = ws.next().json();
    if (j["type"] == "subscribed") served++;
    if (j["type"] == "error" && j["code"] == "rate_limited") {
      limited++;
      CHECK(ws.wait_closed() == 1013);
    }
  }
  CHECK(served == 5);
  CHECK(limited == 1);
  // Another person is not affected.
  auto bob = f.open({{"Cookie", "session=bob-session"}});
  bob.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
  bob.next_of_type("subscribed");
  // An address: 5 API-key sockets from it; the 6th is refused, another address is served.
  std::vector<WsClient> keyed;
  for (int i = 0; i < 5; ++i)
    keyed.emplace_back(
        f.port, "/api/inventory/live",
        std::vector<std::pair<std::string, std::string>>{{"Authorization", "Bearer ci-key"}},
        "127.0.1.1");
  expect_refused(
      WsClient(f.port, "/api/inventory/live", {{"Authorization", "Bearer ci-key"}}, "127.0.1.1"),
      "rate_limited", 1013);
  auto other =
      WsClient(f.port, "/api/inventory/live", {{"Authorization", "Bearer ci-key"}}, "127.0.1.2");
  other.send(sub("w", "me").dump());
  other.next_of_type("subscribed");
}

TEST_CASE("16 sockets per viewer and the 17th is refused with 1013") {
  Fixture f;
  std::vector<WsClient> sockets;
  for (int i = 0; i < 16; ++i) {  // 4 addresses x 4 sockets stay under the open rate limit
    sockets.emplace_back(
        f.port, "/api/inventory/live",
        std::vector<std::pair<std::string, std::string>>{{"Authorization", "Bearer ada-key"}},
        "127.0.2." + std::to_string(i / 4 + 1));
  }
  for (auto& ws : sockets) {
    ws.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
    ws.next_of_type("subscribed");
  }
  expect_refused(
      WsClient(f.port, "/api/inventory/live", {{"Authorization", "Bearer ada-key"}}, "127.0.2.9"),
      "too_many_sockets", 1013);
  // The same account with another key (other scopes, other viewer id) is not counted with it.
  auto oauth = WsClient(f.port, "/api/inventory/live", {{"Authorization", "Bearer ada-oauth"}},
                        "127.0.2.10");
  oauth.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
  oauth.next_of_type("subscribed");
  // When one closes, there is room again.
  sockets.front().close();
  CHECK(sockets.front().wait_closed() != 0);
  REQUIRE(eventually(
      [&] {
        auto ws = WsClient(f.port, "/api/inventory/live", {{"Authorization", "Bearer ada-key"}},
                           "127.0.2.11");
        ws.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
        auto r = ws.next();
        return !r.closed && r.json()["type"] == "subscribed";
      },
      5s, 50ms));
}

TEST_CASE("a revoked session is closed with 1008 within the re-check period") {
  Fixture f(/*recheck_seconds=*/1);
  auto ws = f.open();
  ws.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
  ws.next_of_type("subscribed");
  f.sql("DELETE FROM auth.sessions WHERE token_sha256 = encode(sha256('" + kAdaToken +
        "'), 'hex')");
  const auto start = std::chrono::steady_clock::now();
  expect_error(ws, "unauthorized");
  CHECK(ws.wait_closed(5s) == 1008);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
}

TEST_CASE(
    "re-checks that fall due together share pool tasks: revoked keys close 1008, the others stay") {
  // One pool connection: 60 re-checks posted one task each would queue 60 round trips behind it.
  Fixture f(/*recheck_seconds=*/2, {{"db_pool_size", 1}});
  f.sql(
      "INSERT INTO auth.api_keys SELECT encode(sha256(('bk' || i)::bytea), 'hex'), "
      "'service_account:b' || i, 'service_account:b' || i, '{read}', NULL "
      "FROM generate_series(1, 60) i");
  std::vector<WsClient> sockets;
  for (int i = 1; i <= 60; ++i) {  // an address each: 5 opens per second per address
    sockets.emplace_back(f.port, "/api/inventory/live",
                         std::vector<std::pair<std::string, std::string>>{
                             {"Authorization", "Bearer bk" + std::to_string(i)}},
                         "127.0.2." + std::to_string(i));
  }
  for (auto& ws : sockets) {
    ws.send(sub("me", "me").dump());
    REQUIRE(ws.next_of_type("subscribed")["id"] == "me");
  }
  f.sql(
      "UPDATE auth.api_keys SET revoked_at = now() WHERE key_sha256 IN (SELECT "
      "encode(sha256(('bk' || i)::bytea), 'hex') FROM generate_series(1, 10) i)");
  const double rechecks_before = metric_or_zero(f.port, "outlive_credential_rechecks_total");
  const double batches_before = metric_or_zero(f.port, "outlive_credential_recheck_batches_total");
  for (int i = 0; i < 10; ++i) {
    expect_error(sockets[i], "unauthorized");
    CHECK(sockets[i].wait_closed(5s) == 1008);
  }
  // Two more rounds of the 50 that stay.
  REQUIRE(eventually(
      [&] {
        return metric_or_zero(f.port, "outlive_credential_rechecks_total") - rechecks_before >= 110;
      },
      10s, 50ms));
  const double rechecks =
      metric_or_zero(f.port, "outlive_credential_rechecks_total") - rechecks_before;
  const double batches =
      metric_or_zero(f.port, "outlive_credential_recheck_batches_total") - batches_before;
  INFO(rechecks << " re-checks in " << batches << " pool tasks");
  CHECK(batches > 0);
  CHECK(batches * 2 <= rechecks);  // sockets opened together are re-checked together
  CHECK(metric_or_zero(f.port, R"(outlive_socket_closes_total{code="1011"})") == 0);
  for (int i = 10; i < 60; ++i) {  // still open and served
    sockets[i].send(sub("again", "me").dump());
    CHECK(sockets[i].next_of_type("subscribed")["id"] == "again");
  }
}

TEST_CASE(
    "a slow reader catches up from the window while a fast reader on the same key keeps "
    "receiving") {
  // SPEC 5.7 rev 2: a reader whose send buffer is full is not closed; it is fed from the window at
  // its own pace and ends with every update, in order.
  Fixture f;
  WsClient slow(f.port, "/api/inventory/live", {{"Cookie", kAdaCookie}}, "127.0.0.1",
                /*receive_buffer=*/4096);
  slow.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
  slow.next_of_type("subscribed");
  auto fast = f.open();
  fast.send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
  fast.next_of_type("subscribed");
  // 8 KiB updates (960 KiB, past the 256 KiB send buffer); the slow client reads nothing until
  // the end.
  const std::string blob(8 * 1024, 'x');
  std::vector<double> latencies_ms;
  for (int i = 0; i < 120; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f.publish(kNorth, {{"type", "item.changed"}, {"itemId", std::to_string(i)}, {"blob", blob}});
    const auto u = fast.next_of_type("update");
    CHECK(u["data"]["itemId"] == std::to_string(i));
    latencies_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(latencies_ms.begin(), latencies_ms.end());
  WARN("fast reader p50 " << latencies_ms[60] << " ms, max " << latencies_ms.back() << " ms");
  CHECK(latencies_ms[60] < 1000);  // generous: the slow reader does not hold it up
  for (int i = 0; i < 120; ++i) {
    const auto u = slow.next_of_type("update");
    REQUIRE(u["data"]["itemId"] == std::to_string(i));
  }
  CHECK(metric_or_zero(f.port, R"(outlive_socket_closes_total{code="1013"})") == 0);
  CHECK(metric_or_zero(f.port, R"(outlive_catch_ups_total{app="inventory"})") >= 1);
}

TEST_CASE("SIGTERM closes every socket with 1012 and the replica exits 0") {
  harness::EmbeddedNats nats;
  const std::string db = fresh_database();
  {
    pqxx::connection c(db);
    pqxx::work tx(c);
    tx.exec(kSchema);
    tx.commit();
  }
  ServeChild replica(config_json(db, nats.url()), harness::make_temp_dir("outlive-sigterm-"), "c");
  const int port = replica.port();
  std::vector<WsClient> sockets;
  for (int i = 0; i < 3; ++i) {
    sockets.emplace_back(port, "/api/inventory/live",
                         std::vector<std::pair<std::string, std::string>>{{"Cookie", kAdaCookie}});
    sockets.back().send(sub("w", "warehouse", {{"warehouse", "north"}}).dump());
    sockets.back().next_of_type("subscribed");
  }
  ::kill(replica.pid(), SIGTERM);
  for (auto& ws : sockets) CHECK(ws.wait_closed() == 1012);
  const auto status = replica.wait_for(15s);
  INFO(harness::tail_of_file(replica.log_path()));
  REQUIRE(status);
  CHECK(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 0);
}
