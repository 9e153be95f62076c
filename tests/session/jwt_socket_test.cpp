// Sockets with JWT credentials (SPEC 5.1 rev 4, 5.3, 5.7 close 4401): a real in-process replica on
// a fresh PostgreSQL database and a real nats-server, driven by real websocket clients, with
// tokens signed by the test (HS256 from a secret file the test writes). The verification itself,
// algorithm by algorithm and with a JWKS, is tested in tests/jwt/.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <pqxx/pqxx>

#include "config/config.hpp"
#include "replica/replica.hpp"
#include "support/frames.hpp"
#include "support/inventory.hpp"
#include "support/jwt_signer.hpp"
#include "support/services.hpp"
#include "support/ws_client.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSecret = "a-test-secret-of-at-least-32-bytes!!";

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A token for `sub`, valid from a minute ago until `exp_in` seconds from now.
json token_claims(const std::string& sub, int64_t exp_in = 3600) {
  const int64_t now = unix_now();
  return {{"sub", sub}, {"iat", now - 60}, {"exp", now + exp_in}, {"aud", "inventory"}};
}

struct Fixture {
  explicit Fixture(json jwt_extra = json::object()) : db(fresh_database()) {
    {
      pqxx::connection c(db);
      pqxx::work tx(c);
      tx.exec(kInventoryTables + kAdaSeed);
      tx.commit();
    }
    const auto dir = std::filesystem::temp_directory_path() /
                     ("outlive-jwt-" + std::to_string(::getpid()) + "-" +
                      std::to_string(Clock::now().time_since_epoch().count()));
    std::filesystem::create_directories(dir);
    secret_file = (dir / "secret").string();
    std::ofstream(secret_file) << kSecret << "\n";
    json channels = {{"warehouse",
                      {{"scope", kWarehouseScopeSchema},
                       {"keys", kWarehouseKeys},
                       {"authorize", kWarehouseAuthorize}}}};
    json cfg = inventory_replica_config(db, nats.url(), "r1", channels);
    json jwt = {{"hmac_secret_file", secret_file},
                {"algorithms", {"HS256"}},
                {"audience", "inventory"},
                {"cookie", "idp_token"}};
    jwt.update(jwt_extra);
    cfg["auth"]["jwt"] = jwt;
    replica = std::make_unique<replica::Replica>(config::parse(cfg));
    REQUIRE(eventually([&] { return http_get(port(), "/readyz").first == 200; }, 30s, 20ms));
  }

  int port() const { return replica->port(); }

  std::string token(const json& payload) const { return key.sign(payload); }

  WsClient open_bearer(const std::string& token) {
    return WsClient(port(), "/api/inventory/live", {{"Authorization", "Bearer " + token}});
  }

  void publish(const std::string& key_, const json& data) {
    pqxx::connection c(db);
    pqxx::work tx(c);
    tx.exec_params("SELECT events.publish_live('inventory', $1, $2::jsonb)", key_, data.dump());
    tx.commit();
    pqxx::nontransaction(c).exec("SELECT events.wake('inventory')");
  }

  std::string db;
  harness::EmbeddedNats nats;
  std::string secret_file;
  TestKey key = TestKey::hmac(kSecret);
  std::unique_ptr<replica::Replica> replica;
};

json sub(const std::string& id, const std::optional<std::string>& cursor = std::nullopt) {
  json m = {{"type", "sub"}, {"id", id}, {"channel", "warehouse"}, {"scope", kNorthScope}};
  if (cursor) m["cursor"] = *cursor;
  return m;
}

json auth_message(const std::string& token) { return {{"type", "auth"}, {"token", token}}; }

// The error frame and the close a refused socket receives.
void require_refused(WsClient& ws, const std::string& code = "unauthorized", int close = 1008) {
  const auto error = ws.next_of_type("error");
  CHECK(error["code"] == code);
  CHECK(ws.wait_closed() == close);
}

}  // namespace

TEST_CASE("a JWT as Bearer opens a socket for its viewer, who receives the updates it may read") {
  Fixture f;
  auto ws = f.open_bearer(f.token(token_claims("ada")));
  ws.send(sub("n").dump());
  const auto subscribed = ws.next_of_type("subscribed");
  f.publish(kNorth, {{"n", 1}});
  const auto update = ws.next_of_type("update");
  CHECK(update["data"] == json{{"n", 1}});
  CHECK(metric(f.port(), R"(outlive_jwt_verifications_total{result="ok"})") >= 1);
}

TEST_CASE("a JWT's viewer id is id_prefix and sub, and authorize() sees it as the accessSubject") {
  Fixture f;
  // bob is not a member of north: the same token shape, another subject, is refused access.
  auto ws = f.open_bearer(f.token(token_claims("bob")));
  ws.send(sub("n").dump());
  const auto answer = ws.next(10s);
  REQUIRE_FALSE(answer.closed);
  CHECK(answer.json()["type"] == "error");
  CHECK(answer.json()["code"] == "not_found");
}

TEST_CASE("refused JWTs close 1008 with unauthorized") {
  Fixture f;
  SECTION("a bad signature") {
    auto ws = f.open_bearer(TestKey::hmac("another secret of the same length!!!").sign(token_claims("ada")));
    require_refused(ws);
  }
  SECTION("alg none") {
    auto ws = f.open_bearer(unsigned_token(token_claims("ada")));
    require_refused(ws);
  }
  SECTION("expired beyond the leeway") {
    auto ws = f.open_bearer(f.token(token_claims("ada", -31 - 5)));
    require_refused(ws);
  }
  SECTION("another audience") {
    auto c = token_claims("ada");
    c["aud"] = "billing";
    auto ws = f.open_bearer(f.token(c));
    require_refused(ws);
  }
  SECTION("no sub") {
    auto c = token_claims("ada");
    c.erase("sub");
    auto ws = f.open_bearer(f.token(c));
    require_refused(ws);
  }
  CHECK(metric(f.port(), R"(outlive_jwt_verifications_total{result="ok"})") == 0);
}

TEST_CASE("the tab's first auth message is its credential, and subs sent before it wait for it") {
  Fixture f;
  WsClient ws(f.port(), "/api/inventory/live");
  ws.send(sub("early").dump());
  ws.send(auth_message(f.token(token_claims("ada"))).dump());
  const auto subscribed = ws.next(10s);
  REQUIRE_FALSE(subscribed.closed);
  CHECK(subscribed.json()["type"] == "subscribed");
  CHECK(subscribed.json()["id"] == "early");
  f.publish(kNorth, {{"n", 2}});
  CHECK(ws.next_of_type("update")["data"] == json{{"n", 2}});
}

TEST_CASE("no auth message within 5 s closes 1008, and a token in the URL is not a credential") {
  Fixture f;
  const auto opened = Clock::now();
  WsClient ws(f.port(), "/api/inventory/live?token=" + f.token(token_claims("ada")) +
                            "&access_token=" + f.token(token_claims("ada")));
  ws.send(sub("n").dump());
  require_refused(ws);
  const auto waited = Clock::now() - opened;
  CHECK(waited >= 4500ms);
  CHECK(waited < 9s);
}

TEST_CASE("a JWT in the configured cookie obeys the Origin rule") {
  Fixture f;
  const std::string cookie = "idp_token=" + f.token(token_claims("ada"));
  {
    WsClient ws(f.port(), "/api/inventory/live",
                {{"Cookie", cookie}, {"Origin", "http://localhost:8080"}});
    ws.send(sub("n").dump());
    CHECK(ws.next_of_type("subscribed")["id"] == "n");
  }
  WsClient evil(f.port(), "/api/inventory/live", {{"Cookie", cookie}, {"Origin", "https://evil.example"}});
  require_refused(evil, "forbidden_origin");
}

TEST_CASE("refresh: auth_expiring, a new token keeps the socket and its subscriptions") {
  Fixture f;
  // exp 25 s ago is still inside the 30 s leeway: the socket opens and is told at once.
  auto ws = f.open_bearer(f.token(token_claims("ada", -25)));
  const auto expiring = ws.next_of_type("auth_expiring");
  CHECK(expiring["in_ms"] == 0);
  ws.send(sub("n").dump());
  const auto subscribed = ws.next_of_type("subscribed");
  ws.send(auth_message(f.token(token_claims("ada", 3600))).dump());
  // Past the old token's exp + leeway (5 s from the open): still served, nothing lost.
  const auto until = Clock::now() + 8s;
  int n = 0;
  while (Clock::now() < until) {
    f.publish(kNorth, {{"n", ++n}});
    const auto update = ws.next_of_type("update");
    CHECK(update["data"] == json{{"n", n}});
    std::this_thread::sleep_for(500ms);  // (a pace of updates, not a wait for an event)
  }
  CHECK(n >= 10);
}

TEST_CASE("refresh: no new token closes 4401 token_expired, and the tab resumes from its cursor") {
  Fixture f;
  auto ws = f.open_bearer(f.token(token_claims("ada", -25)));
  ws.send(sub("n").dump());
  const auto subscribed = ws.next_of_type("subscribed");
  const std::string cursor = subscribed["cursor"];
  const auto error = ws.next_of_type("error");
  CHECK(error["code"] == "token_expired");
  CHECK(ws.wait_closed() == 4401);
  // Published while the tab had no socket: the next socket, with a fresh token, replays it.
  f.publish(kNorth, {{"missed", true}});
  auto again = f.open_bearer(f.token(token_claims("ada")));
  again.send(sub("n", cursor).dump());
  CHECK(again.next_of_type("update")["data"] == json{{"missed", true}});
}

TEST_CASE("refresh: a new token for another subject, or an invalid one, closes 1008") {
  Fixture f;
  auto ws = f.open_bearer(f.token(token_claims("ada")));
  ws.send(sub("n").dump());
  ws.next_of_type("subscribed");
  SECTION("another subject") { ws.send(auth_message(f.token(token_claims("bob"))).dump()); }
  SECTION("an invalid token") {
    ws.send(auth_message(TestKey::hmac("not the secret, but as long as it!!!").sign(token_claims("ada")))
                .dump());
  }
  require_refused(ws);
}

TEST_CASE("session cookies keep working beside JWTs, and refuse an auth message") {
  Fixture f;
  WsClient ws(f.port(), "/api/inventory/live", {{"Cookie", kAdaCookie}});
  ws.send(sub("n").dump());
  ws.next_of_type("subscribed");
  ws.send(auth_message(f.token(token_claims("ada"))).dump());
  const auto error = ws.next_of_type("error");
  CHECK(error["code"] == "invalid_message");
  f.publish(kNorth, {{"n", 3}});
  CHECK(ws.next_of_type("update")["data"] == json{{"n", 3}});
}
