// Channels answered by the application over HTTP (SPEC 5.4 rev 4): a real in-process replica on a
// fresh PostgreSQL database and a real nats-server, whose hook channels POST to the test's own
// hook server (support/hook_server: keep-alive HTTP/1.1 that checks Outlive-Signature and answers
// from Postgres, as an application's service would). Every wait has a deadline.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <thread>

#include "common/error.hpp"
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

const std::string kSchema = kInventoryTables + kAdaSeed + R"SQL(
INSERT INTO inventory.members VALUES ('00000000-0000-0000-0000-00000000000a', 'user:bob');
INSERT INTO auth.sessions VALUES
  (encode(sha256('bob-session'), 'hex'), 'user:bob', 'user:bob', false, now() + interval '1 hour'),
  (encode(sha256('carol-session'), 'hex'), 'user:carol', 'user:carol', false, now() + interval '1 hour');
)SQL";

// How the "gate" channel's authorize answers (keys() answers [scope.k] always).
enum class Gate { ok, status500, not_json, wrong_type, number, closes, slow_3s, hang, slow_100ms };

// The application's hook: answers keys() and authorize() of three channels from Postgres, with
// switches the tests turn.
struct App {
  explicit App(std::string db) : db(std::move(db)) {}

  HookServer::Answer answer(const HookServer::Request& r) {
    const json q = json::parse(r.body);
    const std::string op = q.at("op"), channel = q.at("channel");
    {
      std::lock_guard lock(mutex);
      if (op == "authorize") authorize_sizes.push_back(q.at("viewers").size());
      if (op == "authorize") authorized_keys.push_back(q.at("key"));
      if (op == "authorize") authorize_calls.emplace_back(q.at("key"), q.at("viewers").size());
      if (op == "keys" && channel == "mine_hook") ++collection_keys;
      if (q.at("app") != "inventory") wrong_app = true;
    }
    if (op == "keys" && channel == "gate_hook") return {200, json{{"keys", {q.at("scope").at("k")}}}.dump()};
    const std::string key = q.value("key", "");
    if (op == "authorize" && channel == "gate_hook") {
      json all = json::array();
      for (const auto& v : q.at("viewers")) all.push_back(v.at("id"));
      const std::string ok = json{{"allowed", all}}.dump();
      switch (key == "fast" ? Gate::ok : gate.load()) {
        case Gate::ok: return {200, ok};
        case Gate::status500: return {500, R"({"error":"down"})"};
        case Gate::not_json: return {200, "<html>oops"};
        case Gate::wrong_type: return {200, R"({"allowed":"user:ada"})"};
        case Gate::number: return {200, R"({"allowed":5})"};
        case Gate::closes: return {200, ok, 0ms, false, true};
        case Gate::slow_3s: return {200, ok, 3s};
        case Gate::hang: return {200, ok, 0ms, true};
        case Gate::slow_100ms: return {200, ok, 100ms};
      }
    }
    pqxx::connection c(db);
    pqxx::work tx(c);
    if (op == "keys") {
      if (channel == "warehouse_hook") {
        const auto rows = tx.exec_params("SELECT id::text FROM inventory.warehouses WHERE public_id = $1",
                                         q.at("scope").at("warehouse").get<std::string>());
        if (rows.empty()) return {200, R"({"keys":null})"};
        return {200, json{{"keys", {rows[0][0].as<std::string>()}}}.dump()};
      }
      if (channel == "mine_hook") {
        json keys = json::array();
        for (const auto& row : tx.exec_params(
                 "SELECT warehouse_id::text FROM inventory.members WHERE subject = $1",
                 q.at("viewer").at("accessSubject").get<std::string>()))
          keys.push_back(row[0].as<std::string>());
        return {200, json{{"keys", keys}}.dump()};
      }
      return {400, "{}"};
    }
    json allowed = json::array();
    for (const auto& v : q.at("viewers")) {
      const auto rows = tx.exec_params(
          "SELECT 1 FROM inventory.members WHERE warehouse_id = $1::uuid AND subject = $2", key,
          v.at("accessSubject").get<std::string>());
      if (!rows.empty()) allowed.push_back(v.at("id"));
    }
    return {200, json{{"allowed", allowed}}.dump()};
  }

  size_t authorized(const std::string& key) {
    std::lock_guard lock(mutex);
    return std::count(authorized_keys.begin(), authorized_keys.end(), key);
  }

  const std::string db;
  std::atomic<Gate> gate{Gate::ok};
  std::mutex mutex;
  std::vector<size_t> authorize_sizes;
  std::vector<std::string> authorized_keys;
  std::vector<std::pair<std::string, size_t>> authorize_calls;  // key, viewers
  std::vector<size_t> sizes_for(const std::string& key) {
    std::lock_guard lock(mutex);
    std::vector<size_t> out;
    for (const auto& [k, n] : authorize_calls)
      if (k == key) out.push_back(n);
    return out;
  }
  int collection_keys = 0;
  bool wrong_app = false;
};

std::string secret_file(const std::string& secret) {
  static int n = 0;
  const auto path = std::filesystem::temp_directory_path() /
                    ("outlive-hook-secret-" + std::to_string(::getpid()) + "-" + std::to_string(++n));
  std::ofstream(path) << secret << "\n";
  return path.string();
}

json config_json(const std::string& db, const std::string& nats, const std::string& hook_url,
                 const std::string& secret_path) {
  const json gate_scope = {{"type", "object"},
                           {"properties", {{"k", {{"type", "string"}}}}},
                           {"required", {"k"}},
                           {"additionalProperties", false}};
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
      {"warehouse_hook", {{"scope", kWarehouseScopeSchema}, {"hook", {{"url", hook_url}}}}},
      {"mine_hook",
       {{"collection", true},
        {"scope", {{"type", "object"}, {"additionalProperties", false}}},
        {"hook", {{"url", hook_url}}}}},
      {"gate_hook", {{"scope", gate_scope}, {"hook", {{"url", hook_url}, {"timeout_ms", 1000}}}}},
  };
  json c = inventory_replica_config(db, nats, "r1", channels);
  c["hook_secret_file"] = secret_path;
  c["hooks"] = {{"max_in_flight", 8}};
  return c;
}

struct Fixture {
  explicit Fixture(const std::string& replica_secret = kSecret, const std::string& tls_cert = {},
                   const std::string& tls_key = {})
      : db(fresh_database()),
        app(db),
        hooks(kSecret, [this](const HookServer::Request& r) { return app.answer(r); }, tls_cert, tls_key) {
    run_sql(db, kSchema);
    replica = std::make_unique<replica::Replica>(
        config::parse(config_json(db, nats.url(), hooks.url(), secret_file(replica_secret))));
    REQUIRE(eventually([&] { return http_get(port(), "/readyz").first == 200; }, 30s, 20ms));
  }
  ~Fixture() {
    replica.reset();
    hooks.stop();
  }
  int port() const { return replica->port(); }
  WsClient open(const std::string& session) {
    return WsClient(port(), "/api/inventory/live", {{"Cookie", "session=" + session}});
  }
  void tx(const std::vector<std::string>& statements) { run_tx(db, statements); }

  std::string db;
  harness::EmbeddedNats nats;
  App app;
  HookServer hooks;
  std::unique_ptr<replica::Replica> replica;
};

}  // namespace

TEST_CASE("hook channels give the same frames as the equivalent SQL channels, over kept-alive connections") {
  std::vector<json> sql;
  {
    Fixture g;
    sql = scenario(g, "warehouse", "my_warehouses");
  }
  Fixture f;
  const int requests_before = f.hooks.requests();
  const auto hook = scenario(f, "warehouse_hook", "mine_hook");
  INFO(json(hook).dump());
  CHECK(json(sql).dump() == json(hook).dump());
  REQUIRE(hook.size() == 10);
  CHECK(hook[2]["code"] == "not_found");
  CHECK(hook[5] == json{{"type", "revoked"}, {"id", "w"}, {"reason", "access_denied"}});
  CHECK(hook[7]["reason"] == "keys_changed");
  const int requests = f.hooks.requests() - requests_before;
  CHECK(requests >= 6);
  // Kept alive: far fewer connections than calls (at most max_in_flight = 8 of them).
  CHECK(f.hooks.connections() <= 8);
  CHECK(f.hooks.connections() < f.hooks.requests());
  CHECK(f.hooks.bad_signatures() == 0);
  std::lock_guard lock(f.app.mutex);
  CHECK(!f.app.wrong_app);
  // After the access update, one authorize call asked for both of north's readers (ada, bob).
  CHECK(std::find(f.app.authorize_sizes.begin(), f.app.authorize_sizes.end(), size_t(2)) !=
        f.app.authorize_sizes.end());
  // /metrics counts the calls per channel and op.
  CHECK(metric(f.port(), R"(outlive_hook_calls_total{app="inventory",channel="warehouse_hook",op="keys",result="ok"})") >= 3);
  CHECK(metric(f.port(), R"(outlive_hook_call_seconds_count{app="inventory",channel="warehouse_hook",op="authorize"})") >= 1);
}

TEST_CASE("a failing hook answer closes 1011, is counted by cause, and the tab resumes without a gap") {
  Fixture f;
  const std::vector<std::pair<Gate, std::string>> failures = {
      {Gate::status500, "status"}, {Gate::not_json, "malformed"}, {Gate::wrong_type, "malformed"},
      {Gate::number, "malformed"},  {Gate::closes, "failed"},     {Gate::slow_3s, "timeout"}};
  int n = 0;
  for (const auto& [gate, cause] : failures) {
    ++n;
    // Two opens per failure, and ada may open 5 sockets a second (SPEC 5.7): pace them.
    const auto paced = Clock::now() + 1100ms;
    const std::string key = "k" + std::to_string(n);
    INFO("failure " << n << ": " << cause);
    auto ws = f.open(kAdaToken);
    std::string cursor;
    ws.send(sub("g", "gate_hook", {{"k", key}}).dump());
    frames_until(ws, "subscribed", &cursor);
    f.app.gate = gate;
    f.tx({access_sql(key), publish_sql(key, {{"n", n}})});
    CHECK(ws.wait_closed(15s) == 1011);
    f.app.gate = Gate::ok;
    auto again = f.open(kAdaToken);
    again.send(sub("g", "gate_hook", {{"k", key}}, cursor).dump());
    const auto frames = frames_until(again, "update");
    INFO(json(frames).dump());
    CHECK(frames.front()["type"] == "subscribed");
    CHECK(frames.back()["data"] == json{{"n", n}});
    CHECK(metric(f.port(), R"(outlive_hook_calls_total{app="inventory",channel="gate_hook",op="authorize",result=")" +
                               cause + "\"}") >= 1);
    std::this_thread::sleep_until(paced);
  }
}

TEST_CASE("a slow hook for one key delays only that key's readers") {
  Fixture f;
  auto slow = f.open(kAdaToken);
  auto fast = f.open("bob-session");
  slow.send(sub("g", "gate_hook", {{"k", "slowkey"}}).dump());
  frames_until(slow, "subscribed");
  fast.send(sub("g", "gate_hook", {{"k", "fast"}}).dump());
  frames_until(fast, "subscribed");
  // The hook takes 3 s for slowkey (its timeout is 1 s: the slow tab ends 1011), while fast's
  // update, committed after, arrives at once.
  f.app.gate = Gate::hang;
  f.tx({access_sql("slowkey"), publish_sql("slowkey", {{"n", 1}})});
  REQUIRE(eventually([&] { return f.app.authorized("slowkey") >= 1; }, 5s, 5ms));
  const auto start = Clock::now();
  f.tx({access_sql("fast"), publish_sql("fast", {{"n", 2}})});
  const auto frames = frames_until(fast, "update", nullptr, 5s);
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK(frames.back()["data"] == json{{"n", 2}});
  CHECK(took < 0.9);  // before the slow key's hook call times out
  CHECK(slow.wait_closed(15s) == 1011);
}

TEST_CASE("a hook call that never answers is a timeout after the hook's timeout_ms, not a stall") {
  Fixture f;
  auto ws = f.open(kAdaToken);
  ws.send(sub("g", "gate_hook", {{"k", "quiet"}}).dump());
  frames_until(ws, "subscribed");
  f.app.gate = Gate::hang;
  const auto start = Clock::now();
  f.tx({access_sql("quiet"), publish_sql("quiet", {{"n", 1}})});
  CHECK(ws.wait_closed(15s) == 1011);
  const double after = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK(after < 5.0);  // the hook's 1 s timeout, not the 10 s deadline
  CHECK(metric(f.port(), R"(outlive_hook_calls_total{app="inventory",channel="gate_hook",op="authorize",result="timeout"})") >= 1);
}

TEST_CASE("the hook refuses a replica whose secret differs: the sub fails with 1011") {
  Fixture f("another secret, not the hook's one");
  auto ws = f.open(kAdaToken);
  ws.send(sub("w", "warehouse_hook", kNorthScope).dump());
  CHECK(ws.wait_closed(15s) == 1011);
  CHECK(f.hooks.bad_signatures() >= 1);
  CHECK(metric(f.port(), R"(outlive_hook_calls_total{app="inventory",channel="warehouse_hook",op="keys",result="status"})") >= 1);
}

TEST_CASE("a replica refuses a hook channel without hook_secret_file or with an unreadable one") {
  const std::string db = fresh_database();
  harness::EmbeddedNats nats;
  json c = config_json(db, nats.url(), "http://127.0.0.1:9/hooks", "/nonexistent/secret");
  try {
    replica::Replica r(config::parse(c));
    FAIL("the replica started");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_input);
    CHECK_THAT(e.what(), Catch::Contains("hook_secret_file /nonexistent/secret"));
  }
  c.erase("hook_secret_file");
  CHECK_THROWS_WITH(config::parse(c), Catch::Contains("needs hook_secret_file"));
}

namespace {

// Sessions "v0-session" ... for viewers user:v0 ... user:v<n-1>.
void add_readers(const std::string& db, int n) {
  std::string sessions = "INSERT INTO auth.sessions VALUES ";
  for (int i = 0; i < n; ++i) {
    const std::string who = "user:v" + std::to_string(i);
    sessions += std::string(i ? ", " : "") + "(encode(sha256('v" + std::to_string(i) +
                "-session'), 'hex'), '" + who + "', '" + who + "', false, now() + interval '1 hour')";
  }
  run_sql(db, sessions);
}

}  // namespace

TEST_CASE("600 readers of one key after an access update: authorize batches of at most 500 reach the hook") {
  Fixture f;
  constexpr int kReaders = 600;
  add_readers(f.db, kReaders);
  std::vector<WsClient> tabs;
  tabs.reserve(kReaders);
  for (int i = 0; i < kReaders; ++i) {
    tabs.push_back(f.open("v" + std::to_string(i) + "-session"));
    tabs.back().send(sub("g", "gate_hook", {{"k", "crowd"}}).dump());
  }
  for (auto& t : tabs) REQUIRE(t.next_of_type("subscribed", 20s)["id"] == "g");
  const size_t before = f.app.sizes_for("crowd").size();
  f.tx({access_sql("crowd"), publish_sql("crowd", {{"n", 1}})});
  for (auto& t : tabs) CHECK(t.next_of_type("update", 20s)["data"] == json{{"n", 1}});
  auto sizes = f.app.sizes_for("crowd");
  sizes.erase(sizes.begin(), sizes.begin() + static_cast<long>(before));
  INFO("authorize calls after the access update: " << json(sizes).dump());
  size_t asked = 0;
  for (const size_t n : sizes) {
    CHECK(n <= 500);
    asked += n;
  }
  CHECK(asked == kReaders);  // every reader asked again once, none twice
  CHECK(std::find(sizes.begin(), sizes.end(), size_t(500)) != sizes.end());
}

TEST_CASE("600 sockets subscribing to one key at once: the hook is asked a few times for many viewers, not once each") {
  Fixture f;
  constexpr int kReaders = 600;
  add_readers(f.db, kReaders);
  // The application takes 100 ms per authorize(): subs arriving meanwhile gather.
  f.app.gate = Gate::slow_100ms;
  std::vector<WsClient> tabs;
  tabs.reserve(kReaders);
  for (int i = 0; i < kReaders; ++i) tabs.push_back(f.open("v" + std::to_string(i) + "-session"));
  // A page-load wave: every sub at once.
  for (auto& t : tabs) t.send(sub("g", "gate_hook", {{"k", "wave"}}).dump());
  for (auto& t : tabs) REQUIRE(t.next_of_type("subscribed", 30s)["id"] == "g");
  const auto sizes = f.app.sizes_for("wave");
  INFO("authorize calls for the wave: " << json(sizes).dump());
  size_t asked = 0;
  for (const size_t n : sizes) {
    CHECK(n <= 500);
    asked += n;
  }
  CHECK(asked == kReaders);  // every viewer asked once
  // One call per sub before the joins (600); now the first call, then those gathered while one
  // was under way.
  CHECK(sizes.size() <= 60);
  f.tx({publish_sql("wave", {{"n", 1}})});
  for (auto& t : tabs) CHECK(t.next_of_type("update", 20s)["data"] == json{{"n", 1}});
}

namespace {

// A throwaway CA and a certificate for 127.0.0.1 signed by it (openssl, as an operator would).
struct TestCa {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("outlive-hook-ca-" + std::to_string(::getpid()));
  TestCa() {
    std::filesystem::create_directories(dir);
    const std::string script =
        "set -e; cd '" + dir.string() + "'; "
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout ca.key -out ca.pem -days 2 -subj /CN=outlive-hook-test-ca 2>/dev/null; "
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key "
        "-out server.csr -subj /CN=hooks 2>/dev/null; "
        "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' > server.ext; "
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem "
        "-days 2 -extfile server.ext 2>/dev/null";
    REQUIRE(std::system(("bash -c \"" + script + "\"").c_str()) == 0);
  }
  ~TestCa() { std::filesystem::remove_all(dir); }
  std::string file(const char* name) const { return (dir / name).string(); }
};

// SSL_CERT_FILE while in scope: OpenSSL's default verify paths (the system CA store) read it.
struct CaStore {
  explicit CaStore(const std::string& file) { ::setenv("SSL_CERT_FILE", file.c_str(), 1); }
  ~CaStore() { ::unsetenv("SSL_CERT_FILE"); }
};

}  // namespace

TEST_CASE("a hook behind https: trusted through the CA store, 1011 when its CA is not there") {
  TestCa ca;
  {
    CaStore store(ca.file("ca.pem"));
    Fixture f(kSecret, ca.file("server.pem"), ca.file("server.key"));
    REQUIRE(f.hooks.url().rfind("https://", 0) == 0);
    auto ws = f.open(kAdaToken);
    ws.send(sub("w", "warehouse_hook", kNorthScope).dump());
    CHECK(frames_until(ws, "subscribed").back()["id"] == "w");
    f.tx({publish_sql(kNorth, {{"n", 1}})});
    CHECK(frames_until(ws, "update").back()["data"] == json{{"n", 1}});
  }
  // The same server, and a replica whose store does not hold the test's CA.
  Fixture f(kSecret, ca.file("server.pem"), ca.file("server.key"));
  auto ws = f.open(kAdaToken);
  ws.send(sub("w", "warehouse_hook", kNorthScope).dump());
  CHECK(ws.wait_closed(15s) == 1011);
  CHECK(f.hooks.requests() == 0);
  CHECK(metric(f.port(), R"(outlive_hook_calls_total{app="inventory",channel="warehouse_hook",op="keys",result="failed"})") >= 1);
}
