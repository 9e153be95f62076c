// events.disconnect (SPEC 2.6 rev 4) end to end: written in the application's transaction, read
// from the topic by real replicas, it ends the sockets of the viewer it names (and the ids under
// it), in order with the updates of that transaction, and refuses the JWTs issued before it, also
// on a replica started afterwards. Sockets use JWTs (tests/session/jwt_fixture.hpp) so the test
// picks the viewer ids and the issue times. Who may call it is tested in tests/outbox/writers_test.
#include "session/jwt_fixture.hpp"
#include "topic/client.hpp"
#include "topic/cursor.hpp"

namespace {

// Every frame until the socket closes (progress frames too), and the close code.
struct Transcript {
  std::vector<json> frames;
  int close_code = 0;
};

Transcript read_until_closed(WsClient& ws, std::chrono::milliseconds within = 15s) {
  Transcript t;
  const auto deadline = Clock::now() + within;
  while (Clock::now() < deadline) {
    const auto r = ws.next(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    if (r.closed) {
      t.close_code = r.close_code;
      break;
    }
    if (r.timed_out) break;
    t.frames.push_back(r.json());
  }
  return t;
}

// The position of the disconnect a replica acts on: the first of its 64 copies in the topic.
uint64_t first_disconnect_position(const Fixture& f) {
  topic::Client client({f.nats.url()}, "test-disconnect-reader");
  uint64_t from = 1;
  for (;;) {
    const auto messages = client.read("inventory", from, 256);
    if (messages.empty()) return 0;
    for (const auto& m : messages) {
      const auto envelope = json::parse(m.data, nullptr, /*allow_exceptions=*/false);
      if (envelope.is_object() && envelope.contains("disconnect")) return m.sequence;
      from = m.sequence + 1;
    }
  }
}

// An update, a disconnect of `viewer` and another update, in one transaction of the app's.
void update_disconnect_update(const std::string& db, const std::string& viewer,
                              const std::string& reason, bool commit = true) {
  pqxx::connection c(db);
  {
    pqxx::work tx(c);
    tx.exec_params("SELECT events.publish_live('inventory', $1, '{\"n\":1}')", kNorth);
    tx.exec_params("SELECT events.disconnect('inventory', $1, $2)", viewer, reason);
    tx.exec_params("SELECT events.publish_live('inventory', $1, '{\"n\":2}')", kNorth);
    if (commit) tx.commit();
  }
  pqxx::nontransaction(c).exec("SELECT events.wake('inventory')");
}

// A token for `sub` issued at `iat` (unix seconds).
json issued_at(const std::string& sub, int64_t iat) {
  return {{"sub", sub}, {"iat", iat}, {"exp", unix_now() + 3600}, {"aud", "inventory"}};
}

}  // namespace

TEST_CASE("a disconnect in the transaction: the update before it arrives, then unauthorized and "
          "1008, never the update after it, on every replica") {
  Fixture f;
  auto ada = f.open_bearer(f.token(token_claims("ada")));
  ada.send(sub("n").dump());
  ada.next_of_type("subscribed");
  // Another socket of ada's under her id (user:ada:phone), subscribed to nothing: ended too.
  auto phone = f.open_bearer(f.token(token_claims("ada:phone")));
  // user:adam is not under user:ada.
  auto adam = f.open_bearer(f.token(token_claims("adam")));
  // Her socket on another replica.
  auto r2 = f.another_replica("r2");
  auto elsewhere = bearer_socket(r2->port(), f.token(token_claims("ada")));

  update_disconnect_update(f.db, "user:ada", "banned");

  const auto t = read_until_closed(ada);
  CHECK(t.close_code == 1008);
  std::vector<json> meaningful;  // without progress frames
  for (const auto& frame : t.frames) {
    if (frame["type"] != "progress") meaningful.push_back(frame);
  }
  REQUIRE(meaningful.size() == 2);
  // Nothing after the disconnect reaches the ended socket, not even a progress cursor past it.
  const uint64_t disconnect_at = first_disconnect_position(f);
  REQUIRE(disconnect_at > 0);
  for (const auto& frame : t.frames) {
    if (frame["type"] != "progress") continue;
    const auto cursor = topic::Cursor::decode(frame["cursor"].get<std::string>());
    REQUIRE(cursor);
    CHECK(cursor->position <= disconnect_at);
  }
  CHECK(meaningful[0]["type"] == "update");
  CHECK(meaningful[0]["data"] == json{{"n", 1}});
  CHECK(meaningful[1]["type"] == "error");
  CHECK(meaningful[1]["code"] == "unauthorized");
  CHECK(meaningful[1]["message"] == "banned");

  const auto phone_error = phone.next_of_type("error");
  CHECK(phone_error["code"] == "unauthorized");
  CHECK(phone.wait_closed() == 1008);

  CHECK(elsewhere.next_of_type("error")["message"] == "banned");
  CHECK(elsewhere.wait_closed() == 1008);

  // adam's socket is open: it answers (adam is no member of north).
  adam.send(sub("n").dump());
  const auto answer = adam.next(10s);
  REQUIRE_FALSE(answer.closed);
  CHECK(answer.json()["code"] == "not_found");
  CHECK(metric(f.port(), R"(outlive_disconnects_total{app="inventory"})") == 1);
}

TEST_CASE("a rolled-back disconnect ends nothing") {
  Fixture f;
  auto ada = f.open_bearer(f.token(token_claims("ada")));
  ada.send(sub("n").dump());
  ada.next_of_type("subscribed");
  update_disconnect_update(f.db, "user:ada", "signed_out", /*commit=*/false);
  f.publish(kNorth, {{"n", 3}});
  const auto update = ada.next_of_type("update");
  CHECK(update["data"] == json{{"n", 3}});
  CHECK(metric_or_zero(f.port(), R"(outlive_disconnects_total{app="inventory"})") == 0);
}

TEST_CASE("a JWT issued before a disconnect is refused, also by a replica started afterwards, and one "
          "issued after it is served") {
  Fixture f;
  const int64_t before = unix_now() - 60;
  auto ada = f.open_bearer(f.token(issued_at("ada", before)));
  ada.send(sub("n").dump());
  ada.next_of_type("subscribed");
  {
    pqxx::connection c(f.db);
    pqxx::work tx(c);
    tx.exec("SELECT events.disconnect('inventory', 'user:ada')");
    tx.commit();
    pqxx::nontransaction(c).exec("SELECT events.wake('inventory')");
  }
  const auto ended = ada.next_of_type("error");
  CHECK(ended["code"] == "unauthorized");
  CHECK(ended["message"] == "signed_out");  // the default reason
  CHECK(ada.wait_closed() == 1008);

  // The same token again, on this replica and on one that did not run when it was written.
  auto again = f.open_bearer(f.token(issued_at("ada", before)));
  const auto refused = again.next_of_type("error");
  CHECK(refused["code"] == "unauthorized");
  CHECK(again.wait_closed() == 1008);
  auto later = f.another_replica("r2");
  auto there = bearer_socket(later->port(), f.token(issued_at("ada", before)));
  CHECK(there.next_of_type("error")["code"] == "unauthorized");
  CHECK(there.wait_closed() == 1008);
  // A sub-id of hers is refused too; a token issued after the disconnect is served.
  auto phone = bearer_socket(later->port(), f.token(issued_at("ada:phone", before)));
  CHECK(phone.wait_closed() == 1008);
  auto fresh = bearer_socket(later->port(), f.token(issued_at("ada", unix_now() + 2)));
  fresh.send(sub("n").dump());
  fresh.next_of_type("subscribed");
  f.publish(kNorth, {{"n", 4}});
  CHECK(fresh.next_of_type("update")["data"] == json{{"n", 4}});
}
