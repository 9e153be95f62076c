// The application's own session check (SPEC 5.1 rev 4, auth.hook): a real in-process replica on a
// fresh PostgreSQL database and a real nats-server, whose credentials go to the test's hook server
// (support/hook_server: checks Outlive-Signature, 401 otherwise). The hook reads the cookie
// "sid=<name>" and names the viewer user:<name>; some names make it misbehave. Every wait has a
// deadline.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "config/config.hpp"
#include "replica/replica.hpp"
#include "support/channel_scenario.hpp"
#include "support/frames.hpp"
#include "support/hook_server.hpp"
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

const std::string kSecret = "a hook secret of the test, 32+ bytes long";
const std::string kOrigin = "http://localhost:8080";

// The application: sid=<name> is user:<name>, except
//   hang / status / malformed: the whole call hangs, answers 500, answers HTML;
//   missing: no result for its ref; refused*, or a name revoked(): {"refused":"signed out"};
//   slow*: the call answers after 3 s, u*: after 300 ms; short*: expires_in_s 2.
struct HookApp {
  HookServer::Answer answer(const HookServer::Request& r) {
    const json q = json::parse(r.body);
    std::lock_guard lock(mutex);
    calls.push_back(q);
    if (!HookServer::check_signature(r.signature, r.body, kSecret).empty()) bad_signature = true;
    json results = json::object();
    std::chrono::milliseconds delay{0};
    for (const auto& c : q.at("credentials")) {
      const std::string cookie = c.at("headers").value("cookie", "");
      const auto at = cookie.find("sid=");
      const std::string name = at == std::string::npos ? "" : cookie.substr(at + 4);
      if (name == "hang") return {200, "{}", 0ms, true};
      if (name == "status") return {500, R"({"error":"down"})"};
      if (name == "malformed") return {200, "<html>oops"};
      if (name == "missing") continue;
      if (name.rfind("slow", 0) == 0) delay = 3s;
      if (name.rfind("u", 0) == 0) delay = std::max<std::chrono::milliseconds>(delay, 300ms);
      if (name.rfind("refused", 0) == 0 || revoked.count(name) > 0) {
        results[c.at("ref").get<std::string>()] = {{"refused", "signed out"}};
        continue;
      }
      const std::string id = "user:" + name;
      json result = {{"viewer", {{"id", id}, {"actor", id}, {"accessSubject", id}, {"scopes", nullptr}}}};
      if (name.rfind("short", 0) == 0) result["expires_in_s"] = 2;
      results[c.at("ref").get<std::string>()] = result;
    }
    return {200, json{{"results", results}}.dump(), delay};
  }

  // The credentials asked for with this cookie, and when the last of them was asked.
  int asked(const std::string& cookie) {
    std::lock_guard lock(mutex);
    int n = 0;
    for (const auto& q : calls)
      for (const auto& c : q.at("credentials")) n += c.at("headers").value("cookie", "") == cookie;
    return n;
  }
  void revoke(const std::string& name) {
    std::lock_guard lock(mutex);
    revoked.insert(name);
  }
  std::vector<size_t> sizes() {
    std::lock_guard lock(mutex);
    std::vector<size_t> out;
    for (const auto& q : calls) out.push_back(q.at("credentials").size());
    return out;
  }

  std::mutex mutex;
  std::vector<json> calls;
  std::set<std::string> revoked;
  bool bad_signature = false;
};

std::string secret_file(const std::string& secret) {
  static int n = 0;
  const auto path = std::filesystem::temp_directory_path() /
                    ("outlive-auth-hook-secret-" + std::to_string(::getpid()) + "-" + std::to_string(++n));
  std::ofstream(path) << secret << "\n";
  return path.string();
}

struct Options {
  int timeout_ms = 1000;
  int max_in_flight = 8;
  std::string replica_secret = kSecret;
};

struct Fixture {
  explicit Fixture(Options o = {})
      : db(fresh_database()), hooks(kSecret, [this](const HookServer::Request& r) { return app.answer(r); }) {
    run_sql(db, kInventoryTables + kAdaSeed +
                    "INSERT INTO inventory.members SELECT '" + kNorth +
                    "', 'user:u' || g FROM generate_series(0, 99) g;\n"
                    "INSERT INTO inventory.members VALUES ('" + kNorth + "', 'user:short'), ('" +
                    kNorth + "', 'user:slow0');\n");
    const json channels = {
        {"warehouse",
         {{"scope", kWarehouseScopeSchema}, {"keys", kWarehouseKeys}, {"authorize", kWarehouseAuthorize}}}};
    json c = inventory_replica_config(db, nats.url(), "r1", channels);
    c["auth"] = {{"recheck_seconds", 60},
                 {"hook", {{"url", hooks.url("/auth")}, {"timeout_ms", o.timeout_ms}}}};
    c["hook_secret_file"] = secret_file(o.replica_secret);
    c["hooks"] = {{"max_in_flight", o.max_in_flight}};
    replica = std::make_unique<replica::Replica>(config::parse(c));
    REQUIRE(eventually([&] { return http_get(port(), "/readyz").first == 200; }, 30s, 20ms));
  }
  ~Fixture() {
    replica.reset();
    hooks.stop();
  }
  int port() const { return replica->port(); }
  WsClient open(const std::string& name, const std::string& address = "198.51.100.1") {
    return WsClient(port(), "/api/inventory/live",
                    {{"Cookie", "sid=" + name}, {"Origin", kOrigin}, {"X-Forwarded-For", address}});
  }
  double calls(const std::string& result) {
    return metric_or_zero(port(), R"(outlive_hook_calls_total{app="inventory",channel="",op="credentials",result=")" +
                                      result + "\"}");
  }

  std::string db;
  harness::EmbeddedNats nats;
  HookApp app;
  HookServer hooks;
  std::unique_ptr<replica::Replica> replica;
};

// The error frame's code (if one came) and the close code, within `timeout`.
std::pair<std::string, int> refusal_of(WsClient& ws, std::chrono::milliseconds timeout = 15s) {
  const auto deadline = Clock::now() + timeout;
  std::string code;
  while (Clock::now() < deadline) {
    auto r = ws.next(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    if (r.timed_out) break;
    if (r.closed) return {code, r.close_code};
    const json j = r.json();
    if (j["type"] == "error") code = j.value("code", "");
  }
  return {code, 0};
}

}  // namespace

TEST_CASE("a session the hook accepts serves its viewer, and the hook saw the headers, origin, address and a valid signature") {
  Fixture f;
  auto ws = WsClient(f.port(), "/api/inventory/live",
                     {{"Cookie", "theme=dark; sid=ada"}, {"Authorization", "Bearer opaque-123"},
                      {"Origin", kOrigin}, {"X-Forwarded-For", "203.0.113.7"}});
  ws.send(sub("w", "warehouse", kNorthScope).dump());
  frames_until(ws, "subscribed");  // authorize() found user:ada, the hook's accessSubject
  run_tx(f.db, {publish_sql(kNorth, {{"n", 1}})});
  const auto frames = frames_until(ws, "update");
  CHECK(frames.back()["data"] == json{{"n", 1}});
  std::lock_guard lock(f.app.mutex);
  REQUIRE(f.app.calls.size() == 1);
  const json& q = f.app.calls[0];
  CHECK(q["app"] == "inventory");
  REQUIRE(q["credentials"].size() == 1);
  CHECK(q["credentials"][0] == json{{"ref", "1"},
                                    {"headers", {{"cookie", "theme=dark; sid=ada"}, {"authorization", "Bearer opaque-123"}}},
                                    {"origin", kOrigin},
                                    {"address", "203.0.113.7"}});
  CHECK(!f.app.bad_signature);
  CHECK(f.hooks.bad_signatures() == 0);
  CHECK(f.calls("ok") == 1);
}

TEST_CASE("a credential the hook refuses: unauthorized, close 1008") {
  Fixture f;
  auto ws = f.open("refused-eve");
  CHECK(refusal_of(ws) == std::pair<std::string, int>{"unauthorized", 1008});
  // A cookie from an origin the app does not allow never reaches the hook.
  auto other = WsClient(f.port(), "/api/inventory/live", {{"Cookie", "sid=ada"}, {"Origin", "https://evil.example"}});
  CHECK(refusal_of(other) == std::pair<std::string, int>{"forbidden_origin", 1008});
  // Without any forwarded header there is no credential.
  auto none = WsClient(f.port(), "/api/inventory/live");
  CHECK(refusal_of(none) == std::pair<std::string, int>{"unauthorized", 1008});
  CHECK(f.app.sizes().size() == 1);
}

TEST_CASE("credentials arriving together share calls of at most 64, and every socket opens") {
  Fixture f(Options{2000, 2});
  // While the app's 2 calls are out, the credentials arriving queue and batch.
  std::vector<WsClient> sockets;
  for (int i = 0; i < 100; ++i) {
    // Each its own person and address: the per-person and per-address limits stay out of it.
    sockets.push_back(f.open("u" + std::to_string(i), "10.1." + std::to_string(i / 200) + "." + std::to_string(i % 200 + 1)));
  }
  for (auto& ws : sockets) ws.send(sub("w", "warehouse", kNorthScope).dump());
  for (auto& ws : sockets) frames_until(ws, "subscribed", nullptr, 15s);
  const auto sizes = f.app.sizes();
  INFO(json(sizes).dump());
  CHECK(*std::max_element(sizes.begin(), sizes.end()) <= 64);
  CHECK(*std::max_element(sizes.begin(), sizes.end()) > 1);
  size_t total = 0;
  for (auto n : sizes) total += n;
  CHECK(total == 100);
  CHECK(sizes.size() < 100);
}

TEST_CASE("a hook that times out, answers non-200, malformed JSON or no result for the ref: close 1011, counted") {
  Fixture f;
  const std::vector<std::pair<std::string, std::string>> failures = {
      {"hang", "timeout"}, {"status", "status"}, {"malformed", "malformed"}, {"missing", "ok"}};
  for (const auto& [name, result] : failures) {
    INFO(name);
    const double before = f.calls(result);
    auto ws = f.open(name);
    CHECK(refusal_of(ws).second == 1011);
    CHECK(f.calls(result) == before + 1);
  }
}

TEST_CASE("a slow hook for new sockets does not delay updates to open ones") {
  Fixture f(Options{5000, 2});
  auto ada = f.open("ada");
  ada.send(sub("w", "warehouse", kNorthScope).dump());
  frames_until(ada, "subscribed");
  std::vector<WsClient> slow;
  for (int i = 0; i < 3; ++i) slow.push_back(f.open("slow" + std::to_string(i), "10.2.0." + std::to_string(i + 1)));
  REQUIRE(eventually([&] { return f.app.asked("sid=slow0") == 1; }, 5s, 5ms));
  const auto published = Clock::now();
  run_tx(f.db, {publish_sql(kNorth, {{"n", 2}})});
  const auto frames = frames_until(ada, "update", nullptr, 2s);
  CHECK(frames.back()["data"] == json{{"n", 2}});
  CHECK(Clock::now() - published < 1500ms);
  // The slow hook's first socket opens once it answers (about 3 s).
  slow[0].send(sub("w", "warehouse", kNorthScope).dump());
  frames_until(slow[0], "subscribed", nullptr, 8s);
}

TEST_CASE("with expires_in_s the hook is asked again by then, and once it refuses, the socket closes 1008") {
  Fixture f;
  auto ws = f.open("short");
  ws.send(sub("w", "warehouse", kNorthScope).dump());
  frames_until(ws, "subscribed");
  const auto admitted = Clock::now();
  REQUIRE(eventually([&] { return f.app.asked("sid=short") >= 2; }, 4s, 10ms));
  const auto again = Clock::now() - admitted;
  CHECK(again >= 1500ms);
  CHECK(again <= 3500ms);
  f.app.revoke("short");
  const auto revoked = Clock::now();
  CHECK(refusal_of(ws, 5s) == std::pair<std::string, int>{"unauthorized", 1008});
  CHECK(Clock::now() - revoked <= 3500ms);
  CHECK(f.app.asked("sid=short") >= 3);
}

TEST_CASE("a replica signing with another secret: the hook answers 401 and the socket closes 1011") {
  Fixture f(Options{1000, 8, "not the application's secret, 32+ bytes"});
  auto ws = f.open("ada");
  CHECK(refusal_of(ws).second == 1011);
  CHECK(f.hooks.bad_signatures() >= 1);
  CHECK(f.calls("status") >= 1);
}
