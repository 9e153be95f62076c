// Server-Sent Events end to end (SPEC 5.9): a real in-process replica (publisher, window, HTTP
// server) on a fresh PostgreSQL database and a real nats-server, read by a plain SSE client. The
// same session as a websocket's serves the stream: subscriptions, cursors and replay, filters,
// access at delivery, progress; plus what is the stream's own: keep-alive comments, rotation,
// `event: close` with the websocket close code, HTTP statuses for refusals known before the
// stream. Every wait has a deadline.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include <thread>

#include "common/base64url.hpp"
#include "sse/sse_client.hpp"
#include "support/frames.hpp"
#include "support/inventory.hpp"
#include "support/jwt_signer.hpp"
#include "support/replica_fixture.hpp"
#include "support/services.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// ada reads north (kAdaSeed), not south; she also has an API key for the POST's token.
const std::string kSchema = kInventoryTables + kAdaSeed + R"SQL(
INSERT INTO auth.api_keys VALUES (encode(sha256('ada-key'), 'hex'), 'user:ada', 'user:ada', NULL, NULL);
)SQL";

ReplicaFixture::MakeConfig sse_config(int max_seconds = 600, int keep_alive_ms = 15000,
                                      int progress_quiet_ms = 30000) {
  return [=](const std::string& db, const std::string& nats) {
    json channels = {{"warehouse",
                      {{"scope", kWarehouseScopeSchema},
                       {"keys", kWarehouseKeys},
                       {"authorize", kWarehouseAuthorize}}}};
    json c = inventory_replica_config(db, nats, "r1", channels);
    c["server"] = {{"sse_max_seconds", max_seconds},
                   {"sse_keep_alive_ms", keep_alive_ms},
                   {"progress_quiet_ms", progress_quiet_ms}};
    return c;
  };
}

// sse_config with HS256 JWTs beside the SQL credentials (SPEC 5.1 rev 4), the secret in a file
// written here.
const std::string kJwtSecret = "a-test-secret-of-at-least-32-bytes!!";
ReplicaFixture::MakeConfig sse_jwt_config() {
  const auto secret_file =
      std::filesystem::temp_directory_path() /
      ("outlive-sse-jwt-" + std::to_string(::getpid()) + "-" +
       std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::ofstream(secret_file) << kJwtSecret << "\n";
  return [=](const std::string& db, const std::string& nats) {
    json c = sse_config()(db, nats);
    c["auth"]["jwt"] = {{"hmac_secret_file", secret_file.string()},
                        {"algorithms", {"HS256"}},
                        {"audience", "inventory"}};
    return c;
  };
}

// Claims of ada's JWT, issued a minute ago and expiring `exp_in` seconds from now.
json ada_claims(int64_t exp_in) {
  const int64_t now = unix_now();
  return {{"sub", "ada"}, {"iat", now - 60}, {"exp", now + exp_in}, {"aud", "inventory"}};
}

json sub(const std::string& id, const json& scope, const json& filter = nullptr,
         const std::optional<std::string>& cursor = std::nullopt) {
  json m = {{"type", "sub"}, {"id", id}, {"channel", "warehouse"}, {"scope", scope}};
  if (!filter.is_null()) m["filter"] = filter;
  if (cursor) m["cursor"] = *cursor;
  return m;
}

std::string target(const json& subs, const std::string& app = "inventory") {
  return "/api/" + app + "/live/sse?subs=" + base64url_encode(subs.dump());
}

using Headers = std::vector<std::pair<std::string, std::string>>;
const Headers kAda = {{"Cookie", kAdaCookie}, {"Origin", "http://localhost:8080"}};

// The next data event that is not `progress`; fails on anything else.
json next_frame(SseClient& s, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) FAIL("no frame in time");
    const auto e = s.next(left);
    if (e.kind == SseEvent::Kind::comment) continue;
    if (e.kind != SseEvent::Kind::event) FAIL("the stream ended or timed out");
    if (!e.name.empty()) FAIL("event " << e.name << ": " << e.data);
    auto j = json::parse(e.data);
    if (j["type"] != "progress") return j;
  }
}

// The `event: close` that ends the stream, then the end of the response; its data.
json close_of(SseClient& s, std::chrono::milliseconds timeout = 15s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) FAIL("no close in time");
    const auto e = s.next(left);
    if (e.kind == SseEvent::Kind::end || e.kind == SseEvent::Kind::timed_out)
      FAIL("no close event before the end");
    if (e.kind == SseEvent::Kind::event && e.name == "close") {
      CHECK(s.next(5s).kind == SseEvent::Kind::end);
      return json::parse(e.data);
    }
  }
}

}  // namespace

TEST_CASE("a stream without a cursor is subscribed and receives live updates") {
  ReplicaFixture f(kSchema, sse_config());
  SseClient s(f.port, "GET", target(json::array({sub("w1", kNorthScope)})), kAda);
  REQUIRE(s.status == 200);
  CHECK(s.header("content-type") == "text/event-stream");
  CHECK(s.header("cache-control") == "no-cache");
  CHECK(s.header("x-accel-buffering") == "no");
  const auto subscribed = next_frame(s);
  REQUIRE(subscribed["type"] == "subscribed");
  CHECK(subscribed["id"] == "w1");
  f.publish(kNorth, {{"n", 1}});
  const auto update = next_frame(s, 20s);
  CHECK(update["type"] == "update");
  CHECK(update["ids"] == json{"w1"});
  CHECK(update["key"] == kNorth);
  CHECK(update["data"] == json{{"n", 1}});
}

TEST_CASE("a stream with a cursor replays what it missed, and a filter applies") {
  ReplicaFixture f(kSchema, sse_config());
  std::string cursor;
  {
    SseClient s(f.port, "GET", target(json::array({sub("w1", kNorthScope)})), kAda);
    REQUIRE(s.status == 200);
    cursor = next_frame(s)["cursor"];
  }
  f.publish(kNorth, {{"n", 1}, {"op", "changed"}});
  f.publish(kNorth, {{"n", 2}, {"op", "deleted"}});
  f.publish(kNorth, {{"n", 3}, {"op", "changed"}});
  REQUIRE(eventually([&] {
    pqxx::connection c(f.db);
    return pqxx::nontransaction(c).exec("SELECT count(*) FROM events.outbox")[0][0].as<int>() == 0;
  }, 30s, 20ms));

  SseClient replay(f.port, "GET", target(json::array({sub("all", kNorthScope, nullptr, cursor)})), kAda);
  REQUIRE(replay.status == 200);
  const auto subscribed = next_frame(replay);
  CHECK(subscribed["type"] == "subscribed");
  CHECK(subscribed["cursor"] == cursor);
  for (int n = 1; n <= 3; ++n) {
    const auto u = next_frame(replay, 20s);
    REQUIRE(u["type"] == "update");
    CHECK(u["data"]["n"] == n);
  }

  SseClient filtered(
      f.port, "GET", target(json::array({sub("d", kNorthScope, {{"op", "deleted"}}, cursor)})), kAda);
  REQUIRE(filtered.status == 200);
  CHECK(next_frame(filtered)["type"] == "subscribed");
  const auto u = next_frame(filtered, 20s);
  CHECK(u["data"]["n"] == 2);
  f.publish(kNorth, {{"n", 4}, {"op", "changed"}});
  f.publish(kNorth, {{"n", 5}, {"op", "deleted"}});
  CHECK(next_frame(filtered, 20s)["data"]["n"] == 5);
}

TEST_CASE("a stream whose cursor has left the window is resynced with reason window") {
  ReplicaFixture f(kSchema, sse_config());
  std::string cursor;
  {
    SseClient first(f.port, "GET", target(json::array({sub("w1", kNorthScope)})), kAda);
    REQUIRE(first.status == 200);
    const auto subscribed = next_frame(first);
    REQUIRE(subscribed["type"] == "subscribed");
    cursor = subscribed["cursor"];
  }
  // More than the window's 5,000 updates, of another key, while the tab had no stream.
  f.sql("SELECT events.publish_live('inventory', 'elsewhere', jsonb_build_object('i', i)) "
        "FROM generate_series(1, 5100) i");
  f.sql("SELECT events.wake('inventory')");
  REQUIRE(eventually(
      [&] {
        const auto [status, body] = http_get(f.port, "/api/inventory/live/cursor");
        return status == 200 && position_of(json::parse(body)["cursor"].get<std::string>()) >=
                                    position_of(cursor) + 5100;
      },
      60s, 20ms));
  SseClient s(f.port, "GET", target(json::array({sub("w1", kNorthScope, nullptr, cursor)})), kAda);
  REQUIRE(s.status == 200);
  const auto resync = next_frame(s, 20s);
  INFO(resync.dump());
  REQUIRE(resync["type"] == "resync");
  CHECK(resync["reason"] == "window");
  CHECK(position_of(resync["cursor"].get<std::string>()) > position_of(cursor) + 5000);
  // Live from the resync's cursor.
  f.publish(kNorth, {{"n", 1}});
  CHECK(next_frame(s, 20s)["data"]["n"] == 1);
}

// SPEC 5.7 over 5.9: a stream whose reader takes nothing for 30 s while events wait is ended as a
// socket would be (1013; the close event cannot reach a reader that reads nothing), and holds no
// more than its buffers meanwhile. The tab's next stream, from the last cursor it read, receives
// everything from the window, in order.
TEST_CASE("a stream that takes nothing for 30 s while events wait is ended 1013, and the next one "
          "catches up from its cursor") {
  constexpr int kUpdates = 600;  // of 8 KiB: 4.8 MiB, past every buffer on the way
  ReplicaFixture f(kSchema, sse_config());
  const std::string closed = R"(outlive_socket_closes_total{code="1013"})";
  const double closed_before = metric_or_zero(f.port, closed);
  SseClient stalled(f.port, "GET", target(json::array({sub("w1", kNorthScope)})), kAda, "", 10s,
                    4096);
  REQUIRE(stalled.status == 200);
  const auto subscribed = next_frame(stalled);
  REQUIRE(subscribed["type"] == "subscribed");
  const std::string cursor = subscribed["cursor"];
  f.sql("SELECT events.publish_live('inventory', '" + kNorth +
        "', jsonb_build_object('n', i, 'blob', repeat('x', 8192))) FROM generate_series(1, " +
        std::to_string(kUpdates) + ") i");
  f.sql("SELECT events.wake('inventory')");
  const auto stalled_at = std::chrono::steady_clock::now();
  // The replica gives up on its own: wait for its decision, not a fixed time.
  REQUIRE(eventually([&] { return metric_or_zero(f.port, closed) == closed_before + 1; }, 70s,
                     100ms));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stalled_at).count();
  WARN("the stalled stream was ended after " << waited << " s");
  CHECK(waited >= 25.0);
  CHECK(waited < 65.0);  // 30 s, checked at each 15 s keep-alive tick: 30–45 s, and a margin

  SseClient again(f.port, "GET", target(json::array({sub("w1", kNorthScope, nullptr, cursor)})),
                  kAda);
  REQUIRE(again.status == 200);
  REQUIRE(next_frame(again)["type"] == "subscribed");
  for (int n = 1; n <= kUpdates; ++n) {
    const auto update = next_frame(again, 20s);
    REQUIRE(update["type"] == "update");
    REQUIRE(update["data"]["n"] == n);
  }
}

TEST_CASE("an access update that removes the viewer sends revoked") {
  ReplicaFixture f(kSchema, sse_config());
  SseClient s(f.port, "GET", target(json::array({sub("w1", kNorthScope)})), kAda);
  REQUIRE(s.status == 200);
  REQUIRE(next_frame(s)["type"] == "subscribed");
  f.sql("DELETE FROM inventory.members WHERE subject = 'user:ada';"
        "SELECT events.publish_live('inventory', '" + kNorth + "', NULL, true);");
  {
    pqxx::connection c(f.db);
    pqxx::nontransaction(c).exec("SELECT events.wake('inventory')");
  }
  const auto revoked = next_frame(s, 20s);
  CHECK(revoked["type"] == "revoked");
  CHECK(revoked["id"] == "w1");
  CHECK(revoked["reason"] == "access_denied");
}

TEST_CASE("an idle stream receives progress and keep-alive comments") {
  // Progress after 1 s of quiet (server.progress_quiet_ms) rather than the default 30 s.
  ReplicaFixture f(kSchema, sse_config(600, 300, 1000));
  SseClient s(f.port, "GET", target(json::array({sub("w1", kNorthScope)})), kAda);
  REQUIRE(s.status == 200);
  REQUIRE(next_frame(s)["type"] == "subscribed");
  f.publish(kSouth, {{"n", 1}});  // nothing for this stream
  bool progress = false;
  bool ping = false;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while ((!progress || !ping) && std::chrono::steady_clock::now() < deadline) {
    const auto e = s.next(1s);
    if (e.kind == SseEvent::Kind::comment) ping = ping || e.data == "ping";
    if (e.kind == SseEvent::Kind::event) {
      const auto j = json::parse(e.data);
      REQUIRE(j["type"] == "progress");
      progress = true;
    }
    REQUIRE(e.kind != SseEvent::Kind::end);
  }
  CHECK(progress);
  CHECK(ping);
}

TEST_CASE("a stream ends after sse_max_seconds with event close 1012") {
  ReplicaFixture f(kSchema, sse_config(2));
  const auto opened = std::chrono::steady_clock::now();
  SseClient s(f.port, "GET", target(json::array({sub("w1", kNorthScope)})), kAda);
  REQUIRE(s.status == 200);
  REQUIRE(next_frame(s)["type"] == "subscribed");
  f.publish(kNorth, {{"n", 1}});
  const auto first = next_frame(s, 10s);
  REQUIRE(first["type"] == "update");
  const std::string cursor = first["cursor"];
  const auto close = close_of(s, 10s);
  CHECK(close["code"] == 1012);
  CHECK(std::chrono::steady_clock::now() - opened >= 1900ms);
  // The tab opens a new stream from its cursor: what was published in between is not lost.
  f.publish(kNorth, {{"n", 2}});
  f.publish(kNorth, {{"n", 3}});
  SseClient again(f.port, "GET", target(json::array({sub("w1", kNorthScope, nullptr, cursor)})),
                  kAda);
  REQUIRE(again.status == 200);
  CHECK(next_frame(again)["type"] == "subscribed");
  CHECK(next_frame(again, 10s)["data"]["n"] == 2);
  CHECK(next_frame(again, 10s)["data"]["n"] == 3);
}

TEST_CASE("16 subscriptions per stream: the 17th of the request is refused") {
  ReplicaFixture f(kSchema, sse_config());
  json subs = json::array();
  for (int i = 0; i < 17; ++i) subs.push_back(sub("w" + std::to_string(i), kNorthScope));
  SseClient s(f.port, "GET", target(subs), kAda);
  REQUIRE(s.status == 200);
  int subscribed = 0;
  json refused;
  for (int i = 0; i < 17; ++i) {
    const auto j = next_frame(s);
    if (j["type"] == "subscribed") ++subscribed;
    if (j["type"] == "error") refused = j;
  }
  CHECK(subscribed == 16);
  CHECK(refused["code"] == "too_many_subscriptions");
  CHECK(refused["id"] == "w16");
}

TEST_CASE("subs that are not a JSON array of sub messages, or over 16 KiB, are a 400") {
  ReplicaFixture f(kSchema, sse_config());
  for (const std::string& t :
       {std::string("/api/inventory/live/sse"), std::string("/api/inventory/live/sse?subs=%%%"),
        "/api/inventory/live/sse?subs=" + base64url_encode("{not json"),
        "/api/inventory/live/sse?subs=" + base64url_encode(R"({"type":"sub"})"),
        "/api/inventory/live/sse?subs=" + base64url_encode(R"([{"type":"unsub","id":"a"}])")}) {
    INFO(t);
    SseClient s(f.port, "GET", t, kAda);
    CHECK(s.status == 400);
  }
  auto padded = [](size_t size) {
    json m = sub("w1", kNorthScope);
    m["pad"] = "";
    const size_t base = json::array({m}).dump().size();
    m["pad"] = std::string(size - base, 'x');
    return json::array({m});
  };
  // A GET's request line and headers stay within 16 KiB (SPEC 5.7, 431): that bounds its subs
  // before their own limit does; a POST carries subs of up to 16 KiB.
  SseClient big_get(f.port, "GET", target(padded(16 * 1024 + 1)), kAda);
  CHECK(big_get.status == 431);
  SseClient fits_get(f.port, "GET", target(padded(11 * 1024)), kAda);
  CHECK(fits_get.status == 200);
  CHECK(next_frame(fits_get)["id"] == "w1");
  auto post = [&](size_t size) {
    return json{{"subs", padded(size)}, {"token", "ada-key"}}.dump();
  };
  SseClient big(f.port, "POST", "/api/inventory/live/sse", {}, post(16 * 1024 + 1));
  CHECK(big.status == 400);
  // 16 KiB exactly is a stream; the session answers the message itself.
  SseClient fits(f.port, "POST", "/api/inventory/live/sse", {}, post(16 * 1024));
  CHECK(fits.status == 200);
  CHECK(next_frame(fits)["id"] == "w1");
}

TEST_CASE("refusals before the stream are HTTP statuses") {
  ReplicaFixture f(kSchema, sse_config());
  const json subs = json::array({sub("w1", kNorthScope)});
  SseClient bad(f.port, "GET", target(subs),
                {{"Cookie", "session=not-a-session"}, {"Origin", "http://localhost:8080"}});
  CHECK(bad.status == 401);
  CHECK(json::parse(bad.rest())["code"] == "unauthorized");
  SseClient none(f.port, "GET", target(subs));
  CHECK(none.status == 401);
  SseClient origin(f.port, "GET", target(subs),
                   {{"Cookie", kAdaCookie}, {"Origin", "https://evil.example"}});
  CHECK(origin.status == 403);
  CHECK(json::parse(origin.rest())["code"] == "forbidden_origin");
  SseClient app(f.port, "GET", target(subs, "nope"), kAda);
  CHECK(app.status == 404);
}

TEST_CASE("POST with the token in the body streams as GET does") {
  ReplicaFixture f(kSchema, sse_config());
  const json body = {{"subs", json::array({sub("w1", kNorthScope)})}, {"token", "ada-key"}};
  SseClient s(f.port, "POST", "/api/inventory/live/sse", {}, body.dump());
  REQUIRE(s.status == 200);
  REQUIRE(next_frame(s)["type"] == "subscribed");
  f.publish(kNorth, {{"n", 7}});
  CHECK(next_frame(s, 20s)["data"]["n"] == 7);
  SseClient wrong(f.port, "POST", "/api/inventory/live/sse", {},
                  json{{"subs", json::array()}, {"token", "wrong-key"}}.dump());
  CHECK(wrong.status == 401);
  SseClient malformed(f.port, "POST", "/api/inventory/live/sse", {}, "{\"subs\":3}");
  CHECK(malformed.status == 400);
}

// A streaming fetch sends its JWT in the POST body; it cannot answer `auth_expiring` on the same
// stream, so at expiry the stream ends with the websocket's close 4401 and the client opens a new
// one with a fresh token from its cursors.
TEST_CASE("POST with a JWT streams for its viewer, a forged one is a 401, expiry ends the stream "
          "with close 4401") {
  ReplicaFixture f(kSchema, sse_jwt_config());
  const TestKey key = TestKey::hmac(kJwtSecret);
  auto post = [&](const std::string& token) {
    return std::make_unique<SseClient>(
        f.port, "POST", "/api/inventory/live/sse", Headers{},
        json{{"subs", json::array({sub("w1", kNorthScope)})}, {"token", token}}.dump());
  };
  auto s = post(key.sign(ada_claims(3600)));
  REQUIRE(s->status == 200);
  REQUIRE(next_frame(*s)["type"] == "subscribed");
  f.publish(kNorth, {{"n", 1}});
  CHECK(next_frame(*s, 20s)["data"]["n"] == 1);

  CHECK(post(TestKey::hmac("another secret of the same length!!!").sign(ada_claims(3600)))->status ==
        401);

  // Expired 25 s ago: inside the 30 s leeway for 5 s more.
  auto expiring = post(key.sign(ada_claims(-25)));
  REQUIRE(expiring->status == 200);
  json first = next_frame(*expiring);
  if (first["type"] == "auth_expiring") first = next_frame(*expiring);  // sent at once here
  REQUIRE(first["type"] == "subscribed");
  CHECK(close_of(*expiring, 20s)["code"] == 4401);
}

TEST_CASE("the replica stopping ends streams with event close 1012") {
  ReplicaFixture f(kSchema, sse_config());
  SseClient s(f.port, "GET", target(json::array({sub("w1", kNorthScope)})), kAda);
  REQUIRE(s.status == 200);
  REQUIRE(next_frame(s)["type"] == "subscribed");
  std::thread stop([&] { f.replica->stop(); });
  json close;
  try {
    close = close_of(s, 15s);
  } catch (...) {
    stop.join();
    throw;
  }
  stop.join();
  CHECK(close["code"] == 1012);
}

TEST_CASE("streams count towards a viewer's 16 sockets: the 17th is a 429 until one ends") {
  ReplicaFixture f(kSchema, sse_config());
  const auto t = target(json::array({sub("w1", kNorthScope)}));
  std::vector<std::unique_ptr<SseClient>> streams;
  for (int i = 0; i < 16; ++i) {
    // (paced under the 5 opens per second per person)
    std::this_thread::sleep_for(250ms);
    streams.push_back(std::make_unique<SseClient>(f.port, "GET", t, kAda));
    REQUIRE(streams.back()->status == 200);
    REQUIRE(next_frame(*streams.back())["type"] == "subscribed");
  }
  std::this_thread::sleep_for(250ms);
  SseClient refused(f.port, "GET", t, kAda);
  CHECK(refused.status == 429);
  CHECK(refused.header("retry-after") == "1");
  CHECK(json::parse(refused.rest())["code"] == "too_many_sockets");
  streams.pop_back();  // the client goes away: its stream ends and its place is free
  CHECK(eventually(
      [&] {
        SseClient again(f.port, "GET", t, kAda);
        return again.status == 200;
      },
      10s, 300ms));
}
