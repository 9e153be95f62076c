// Sockets with JWT credentials (SPEC 5.1 rev 4, 5.3, 5.7 close 4401): a real in-process replica on
// a fresh PostgreSQL database and a real nats-server, driven by real websocket clients, with
// tokens signed by the test (HS256 from a secret file the test writes). The verification itself,
// algorithm by algorithm and with a JWKS, is tested in tests/jwt/.
#include "session/jwt_fixture.hpp"

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
