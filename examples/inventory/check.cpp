// outlive_demo_run --check (CTest demo:smoke): the demo end to end through its gateway, as a tab
// would use it: the page, sign-in, a snapshot with its cursor, a socket on the SQL channel
// `warehouse` and one on the C++ channel `warehouse_code`, an update on both, the trigger path, a
// revocation on both. Each step prints what it saw; the first that fails throws.
//
// With --auth jwt (CTest demo:smoke-jwt) the sockets carry a token from the app's POST /api/token
// instead: the first as the tab's first message (what the page's client sends), the C++ channel's
// as Authorization: Bearer. Sockets with the session cookie but no token, and with a forged token,
// are refused; and a token about to expire is replaced on its open socket (auth_expiring -> auth).
#include "check.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "web.hpp"

namespace inventory {

namespace {

using nlohmann::json;
using namespace std::chrono_literals;
namespace web = inventory::web;

struct Step {
  explicit Step(const std::string& what) {
    std::cout << "check: " << what << " ... " << std::flush;
  }
  static void ok(const std::string& detail = "") {
    std::cout << "ok" << (detail.empty() ? "" : " (" + detail + ")") << "\n";
  }
};

void expect(bool condition, const std::string& message) {
  if (!condition) throw std::runtime_error(message);
}

json parse_body(const inventory::web::Response& res, const std::string& what) {
  try {
    return json::parse(res.body);
  } catch (const json::exception&) {
    throw std::runtime_error(what + ": not JSON (HTTP " + std::to_string(res.status) +
                             "): " + res.body.substr(0, 300));
  }
}

// The next frame of `type` (skipping progress and other frames), or throws.
json next_frame(inventory::web::WebSocket& ws, const std::string& type,
                std::chrono::milliseconds timeout,
                const std::function<bool(const json&)>& match = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      throw std::runtime_error("no " + type + " frame within " + std::to_string(timeout.count()) +
                               " ms");
    auto frame = ws.next(left);
    if (frame.timed_out)
      throw std::runtime_error("no " + type + " frame within " + std::to_string(timeout.count()) +
                               " ms");
    if (frame.closed)
      throw std::runtime_error("the socket closed with " + std::to_string(frame.close_code) +
                               " waiting for " + type);
    json j = json::parse(frame.text);
    if (j.value("type", "") == type && (!match || match(j))) return j;
    if (j.value("type", "") == "error")
      throw std::runtime_error("error frame waiting for " + type + ": " + frame.text);
  }
}

// The refusal of SPEC 5.1: an error frame `unauthorized`, then close 1008. Returns its message.
std::string expect_unauthorized(web::WebSocket& ws, std::chrono::milliseconds timeout) {
  auto frame = ws.next(timeout);
  const json error = frame.closed || frame.timed_out ? json::object() : json::parse(frame.text);
  expect(error.value("code", "") == "unauthorized",
         "expected an unauthorized error frame, got " +
             (frame.closed      ? "close " + std::to_string(frame.close_code)
              : frame.timed_out ? "nothing"
                                : frame.text));
  auto closed = ws.next(timeout);
  expect(closed.closed && closed.close_code == 1008,
         "expected close 1008, got " +
             (closed.closed ? std::to_string(closed.close_code) : closed.text));
  return error.value("message", "");
}

json auth_message(const std::string& token) { return json{{"type", "auth"}, {"token", token}}; }

// --auth jwt: a token for the signed-in user (`lifetime_s` 0: the app's default, 5 min).
std::string fetch_token(const std::string& host, int port, const web::Headers& post_headers,
                        int lifetime_s = 0) {
  const json body = lifetime_s > 0 ? json{{"lifetimeS", lifetime_s}} : json::object();
  auto res = web::request(host, port, "POST", "/api/token", post_headers, body.dump());
  expect(res.status == 200,
         "POST /api/token answered " + std::to_string(res.status) + ": " + res.body);
  const json j = parse_body(res, "POST /api/token");
  expect(j.contains("token") && j["token"].is_string(), "no token in " + res.body);
  return j["token"].get<std::string>();
}

// --auth jwt: the app's side of it, through the gateway: the key set the replicas fetch, /api/me
// telling the page, and tokens for signed-in users only.
void check_jwt_endpoints(const std::string& host, int port, const web::Headers& with_cookie,
                         const web::Headers& post_headers) {
  Step s("--auth jwt: GET /.well-known/jwks.json, POST /api/token");
  auto jwks = web::request(host, port, "GET", "/.well-known/jwks.json");
  expect(jwks.status == 200, "GET /.well-known/jwks.json answered " + std::to_string(jwks.status));
  const json keys = parse_body(jwks, "the JWKS");
  expect(keys.contains("keys") && keys["keys"].size() == 1 &&
             keys["keys"][0].value("alg", "") == "ES256",
         "the JWKS: " + jwks.body);
  auto me = web::request(host, port, "GET", "/api/me", with_cookie);
  expect(parse_body(me, "/api/me").value("socketAuth", "") == "jwt",
         "/api/me does not say socketAuth jwt: " + me.body);
  auto anonymous =
      web::request(host, port, "POST", "/api/token", {{"Content-Type", "application/json"}}, "{}");
  expect(anonymous.status == 401,
         "a token without a session answered " + std::to_string(anonymous.status));
  const std::string token = fetch_token(host, port, post_headers);
  expect(std::count(token.begin(), token.end(), '.') == 2, "not a compact JWS: " + token);
  s.ok("kid " + keys["keys"][0].value("kid", "") + ", token " + token.substr(0, 16) + "...");
}

// --auth jwt: what is not a token is not let in. The page's cookie alone is not the socket's
// credential any more (the replica waits 5 s for the auth message, SPEC 5.1 rev 4), and a token
// whose signature was altered does not verify.
void check_tokenless_refused(const std::string& host, int port, const web::Headers& ws_headers,
                             const std::string& token) {
  {
    Step s("a socket with the session cookie and no token is refused after 5 s (error, 1008)");
    web::WebSocket cookie_only(host, port, "/api/inventory/live", ws_headers);
    const json sub = {{"type", "sub"},
                      {"id", "x"},
                      {"channel", "warehouse"},
                      {"scope", {{"warehouse", "north"}}}};
    cookie_only.send(sub.dump());
    const std::string message = expect_unauthorized(cookie_only, 15s);
    s.ok("the sub waited for a token that never came: " + message);
  }
  {
    Step s("a socket with a forged token is refused (error, 1008)");
    std::string forged = token;
    // The first character of the signature: its bits all count, so the signature no longer
    // verifies, and the token keeps its shape (a JWT, not some other credential).
    char& c = forged[forged.rfind('.') + 1];
    c = c == 'A' ? 'B' : 'A';
    web::WebSocket ws(host, port, "/api/inventory/live", ws_headers);
    ws.send(auth_message(forged).dump());
    s.ok(expect_unauthorized(ws, 10s));
  }
}

// --auth jwt: a socket whose token expires soon gets auth_expiring (30 s before `exp`), takes a new
// token on the same socket and keeps its subscription (SPEC 5.1 rev 4, what the page's client
// does).
void check_token_refresh(const std::string& host, int port, const web::Headers& ws_headers,
                         const web::Headers& with_cookie, const web::Headers& post_headers) {
  Step s("a token that expires in 35 s: auth_expiring, a new token on the open socket, an update");
  auto res = web::request(host, port, "GET", "/api/warehouses/north", with_cookie);
  expect(res.status == 200, "snapshot answered " + std::to_string(res.status) + ": " + res.body);
  const json snapshot = parse_body(res, "snapshot");
  const json item = snapshot["items"][0];
  web::WebSocket ws(host, port, "/api/inventory/live", ws_headers);
  ws.send(auth_message(fetch_token(host, port, post_headers, 35)).dump());
  ws.send(json{{"type", "sub"},
               {"id", "r1"},
               {"channel", "warehouse"},
               {"scope", {{"warehouse", "north"}}},
               {"cursor", snapshot["cursor"]}}
              .dump());
  next_frame(ws, "subscribed", 15s);
  const json expiring = next_frame(ws, "auth_expiring", 15s);
  ws.send(auth_message(fetch_token(host, port, post_headers)).dump());
  const int quantity = item["quantity"].get<int>() + 1;
  const std::string item_id = item["id"].get<std::string>();
  auto write = web::request(host, port, "POST", "/api/items/" + item_id + "/quantity", post_headers,
                            json{{"quantity", quantity}}.dump());
  expect(write.status == 200, "the write answered " + std::to_string(write.status));
  auto update = next_frame(ws, "update", 15s, [&](const json& u) {
    return u.contains("data") && u["data"].value("itemId", "") == item_id &&
           u["data"].value("quantity", -1) == quantity;
  });
  expect(update["ids"] == json::array({"r1"}), "the update lists " + update["ids"].dump());
  ws.close();
  s.ok("auth_expiring in_ms " + std::to_string(expiring.value("in_ms", -1)));
}

}  // namespace

void check_demo(int port, bool jwt) {
  const std::string host = "127.0.0.1";
  const std::string origin = "http://127.0.0.1:" + std::to_string(port);
  const web::Headers json_type = {{"Content-Type", "application/json"}};

  {
    Step s("GET / and /outlive.js through the gateway");
    auto page = web::request(host, port, "GET", "/");
    expect(page.status == 200 && page.body.find("/app.js") != std::string::npos,
           "GET / answered " + std::to_string(page.status));
    auto client = web::request(host, port, "GET", "/outlive.js");
    expect(client.status == 200 && client.body.find("class LiveClient") != std::string::npos,
           "GET /outlive.js answered " + std::to_string(client.status));
    auto app_js = web::request(host, port, "GET", "/app.js");
    expect(app_js.status == 200, "GET /app.js answered " + std::to_string(app_js.status));
    s.ok();
  }

  std::string cookie;
  {
    Step s("POST /api/signin");
    auto res = web::request(host, port, "POST", "/api/signin", json_type, "{}");
    expect(res.status == 200, "sign-in answered " + std::to_string(res.status) + ": " + res.body);
    const std::string set_cookie = res.header("Set-Cookie");
    expect(set_cookie.rfind("session=", 0) == 0, "no session cookie: " + set_cookie);
    expect(set_cookie.find("HttpOnly") != std::string::npos, "the session cookie is not HttpOnly");
    cookie = set_cookie.substr(0, set_cookie.find(';'));
    auto me = web::request(host, port, "GET", "/api/me", {{"Cookie", cookie}});
    expect(me.status == 200 && parse_body(me, "/api/me").value("subject", "") == "user:ada",
           "GET /api/me: " + me.body);
    auto anonymous = web::request(host, port, "GET", "/api/warehouses/north");
    expect(anonymous.status == 401,
           "a snapshot without a session answered " + std::to_string(anonymous.status));
    s.ok(cookie.substr(0, 16) + "...");
  }
  const web::Headers with_cookie = {{"Cookie", cookie}};
  web::Headers post_headers = with_cookie;
  post_headers.emplace_back("Content-Type", "application/json");
  if (jwt) check_jwt_endpoints(host, port, with_cookie, post_headers);

  {
    Step s("GET /api/inventory/live/cursor through the gateway (a replica answers)");
    auto res = web::request(host, port, "GET", "/api/inventory/live/cursor");
    expect(res.status == 200 && parse_body(res, "cursor").contains("cursor"),
           "cursor answered " + std::to_string(res.status) + ": " + res.body);
    s.ok();
  }

  json snapshot;
  {
    Step s("GET /api/warehouses/north (cursor first, then the snapshot)");
    auto res = web::request(host, port, "GET", "/api/warehouses/north", with_cookie);
    expect(res.status == 200, "snapshot answered " + std::to_string(res.status) + ": " + res.body);
    snapshot = parse_body(res, "snapshot");
    expect(snapshot.contains("cursor") && snapshot["cursor"].is_string(),
           "no cursor in the snapshot");
    expect(snapshot["items"].is_array() && !snapshot["items"].empty(), "no items in the snapshot");
    s.ok(std::to_string(snapshot["items"].size()) + " items, cursor " +
         snapshot["cursor"].get<std::string>());
  }
  json item = snapshot["items"][0];
  for (const auto& it : snapshot["items"]) {
    if (it["id"] == "n-bolts") item = it;
  }
  const std::string item_id = item["id"].get<std::string>();

  // The page's socket: the browser sends the cookie and its Origin.
  web::Headers ws_headers = with_cookie;
  ws_headers.emplace_back("Origin", origin);
  if (!jwt) {
    Step s("a cookie-less socket through the gateway is refused (error, close 1008)");
    web::WebSocket anonymous(host, port, "/api/inventory/live", {{"Origin", origin}});
    expect_unauthorized(anonymous, 10s);
    s.ok();
  } else {
    check_tokenless_refused(host, port, ws_headers, fetch_token(host, port, post_headers));
  }

  web::WebSocket ws(host, port, "/api/inventory/live", ws_headers);
  // --auth jwt: the token as the tab's first message; the sub below waits for its verification.
  if (jwt) ws.send(auth_message(fetch_token(host, port, post_headers)).dump());
  {
    Step s(std::string("subscribe to warehouse north with the snapshot's cursor") +
           (jwt ? " (the token as the first message)" : ""));
    ws.send(json{{"type", "sub"},
                 {"id", "w1"},
                 {"channel", "warehouse"},
                 {"scope", {{"warehouse", "north"}}},
                 {"cursor", snapshot["cursor"]}}
                .dump());
    auto subscribed = next_frame(ws, "subscribed", 15s);
    expect(subscribed.value("id", "") == "w1", "subscribed for another id");
    s.ok("live from " + subscribed.value("cursor", ""));
  }
  // The same warehouse through channel warehouse_code, declared in C++ (services.hpp): its own
  // socket, so each step below shows what the C++ functions decided apart from the SQL channel.
  // --auth jwt: this one as a non-browser client would: Authorization: Bearer, no cookie.
  web::WebSocket code_ws(
      host, port, "/api/inventory/live",
      jwt ? web::Headers{{"Authorization", "Bearer " + fetch_token(host, port, post_headers)}}
          : ws_headers);
  {
    Step s(std::string("subscribe to warehouse north through the C++ channel warehouse_code") +
           (jwt ? " (the token as Authorization: Bearer)" : ""));
    code_ws.send(json{{"type", "sub"},
                      {"id", "c1"},
                      {"channel", "warehouse_code"},
                      {"scope", {{"warehouse", "north"}}},
                      {"cursor", snapshot["cursor"]}}
                     .dump());
    auto subscribed = next_frame(code_ws, "subscribed", 15s);
    expect(subscribed.value("id", "") == "c1", "subscribed for another id");
    code_ws.send(json{{"type", "sub"},
                      {"id", "c2"},
                      {"channel", "warehouse_code"},
                      {"scope", {{"warehouse", "nowhere"}}}}
                     .dump());
    auto missing = next_frame(code_ws, "error", 15s);
    expect(missing.value("id", "") == "c2" && missing.value("code", "") == "not_found",
           "a warehouse its keys() does not find: " + missing.dump());
    s.ok("keys() and authorize() answered; an unknown warehouse is not_found");
  }

  {
    const int quantity = item["quantity"].get<int>() + 1;
    Step s("POST /api/items/" + item_id + "/quantity " + std::to_string(quantity) +
           " -> update on the socket");
    const auto start = std::chrono::steady_clock::now();
    auto res = web::request(host, port, "POST", "/api/items/" + item_id + "/quantity", post_headers,
                            json{{"quantity", quantity}}.dump());
    expect(res.status == 200, "the write answered " + std::to_string(res.status) + ": " + res.body);
    auto update = next_frame(ws, "update", 15s, [&](const json& u) {
      return u.contains("data") && u["data"].value("itemId", "") == item_id &&
             u["data"].value("quantity", -1) == quantity;
    });
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    expect(update["ids"] == json::array({"w1"}), "the update lists " + update["ids"].dump());
    auto code_update = next_frame(code_ws, "update", 15s, [&](const json& u) {
      return u.contains("data") && u["data"].value("itemId", "") == item_id &&
             u["data"].value("quantity", -1) == quantity;
    });
    expect(code_update["ids"] == json::array({"c1"}),
           "the C++ channel's update lists " + code_update["ids"].dump());
    s.ok(std::to_string(ms) + " ms from the request to the frame; on warehouse_code too");
  }

  {
    Step s("rename an item: the trigger path (events.enqueue) -> update on the socket");
    const std::string other = snapshot["items"].size() > 1 && snapshot["items"][1]["id"] != item_id
                                  ? snapshot["items"][1]["id"].get<std::string>()
                                  : snapshot["items"][0]["id"].get<std::string>();
    const std::string name =
        "renamed at " + std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
    auto res = web::request(host, port, "POST", "/api/items/" + other + "/name", post_headers,
                            json{{"name", name}}.dump());
    expect(res.status == 200,
           "the rename answered " + std::to_string(res.status) + ": " + res.body);
    next_frame(ws, "update", 15s, [&](const json& u) {
      return u.contains("data") && u["data"].value("itemId", "") == other &&
             !u["data"].contains("quantity");
    });
    s.ok(other);
  }

  {
    Step s("remove ada from north: access update -> revoked on both sockets");
    auto res = web::request(host, port, "POST", "/api/warehouses/north/members/remove",
                            post_headers, json{{"subject", "user:ada"}}.dump());
    expect(res.status == 200 && parse_body(res, "remove").value("changed", false),
           "remove answered " + res.body);
    auto revoked = next_frame(ws, "revoked", 15s);
    expect(revoked.value("id", "") == "w1" && revoked.value("reason", "") == "access_denied",
           "revoked: " + revoked.dump());
    // Re-checked through the C++ authorize(): the app's membership service now says no.
    auto code_revoked = next_frame(code_ws, "revoked", 15s);
    expect(code_revoked.value("id", "") == "c1" &&
               code_revoked.value("reason", "") == "access_denied",
           "revoked on warehouse_code: " + code_revoked.dump());
    auto forbidden = web::request(host, port, "GET", "/api/warehouses/north", with_cookie);
    expect(forbidden.status == 403,
           "a non-member's snapshot answered " + std::to_string(forbidden.status));
    s.ok();
  }

  {
    Step s("give ada access again");
    auto res = web::request(host, port, "POST", "/api/warehouses/north/members/add", post_headers,
                            json{{"subject", "user:ada"}}.dump());
    expect(res.status == 200, "add answered " + res.body);
    auto again = web::request(host, port, "GET", "/api/warehouses/north", with_cookie);
    expect(again.status == 200,
           "the snapshot after re-adding answered " + std::to_string(again.status));
    s.ok();
  }
  code_ws.close();
  ws.close();
  if (jwt) check_token_refresh(host, port, ws_headers, with_cookie, post_headers);
}

}  // namespace inventory
