// `outlive check` and the same checks at `outlive serve` start (SPEC 6 rev 3), on real PostgreSQL
// 15 and nats-server: each failure names its configuration path and carries Postgres' message.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/run.hpp"
#include "harness/embedded_nats.hpp"
#include "harness/process.hpp"
#include "support/hook_server.hpp"
#include "support/inventory.hpp"
#include "support/services.hpp"
#include "support/sql.hpp"

using nlohmann::json;
using namespace outlive::testing;
using namespace std::chrono_literals;

namespace {

// The example configuration of SPEC 6.1 on a fresh, migrated database with the inventory tables.
struct Deployment {
  outlive::harness::EmbeddedNats nats;
  std::string db = fresh_database();
  json config;

  Deployment() {
    run_sql(db, kInventoryTables);
    std::ifstream in(source_path("examples/inventory/outlive.json"));
    config = json::parse(in);
    config["database"] = db;
    config["nats"] = {nats.url()};
    config["listen"] = "127.0.0.1:0";
  }

  std::string file(const std::string& name) const { return write_temp_file(name, config.dump(2)); }
};

}  // namespace

TEST_CASE("check passes a valid configuration and exits 0") {
  Deployment d;
  const auto r = run_outlive({"check", "--config", d.file("valid.json")});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("ok (7 statements prepared"));
}

TEST_CASE("check names each broken statement's path with Postgres' message and exits 1") {
  Deployment d;
  d.config["apps"]["inventory"]["channels"]["warehouse"]["keys"] =
      "SELECT x FROM inventory.warehouses WHERE public_id = $1->>'warehouse'";
  d.config["apps"]["inventory"]["channels"]["my_warehouses"]["authorize"] =
      "SELECT v->>'id' FROM jsonb_array_elements($2) v JOIN inventory.nobody n ON true";
  d.config["auth"]["sessions"] =
      "SELECT subject, actor, NULL::text[] AS scopes FROM auth.sessions WHERE token_sha256 = $1";
  const auto r = run_outlive({"check", "--config", d.file("broken.json")});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(
      r.output,
      Catch::Contains("/apps/inventory/channels/warehouse/keys: column \"x\" does not exist\n"));
  CHECK_THAT(r.output, Catch::Contains("/apps/inventory/channels/my_warehouses/authorize: relation "
                                       "\"inventory.nobody\" does not exist\n"));
  CHECK_THAT(r.output,
             Catch::Contains("/auth/sessions: does not return the column(s) app_session"));
  CHECK_THAT(r.output, Catch::Contains("3 problems"));
  // The statements that are right are not reported.
  CHECK_THAT(r.output, !Catch::Contains("/apps/inventory/channels/warehouse/authorize"));
  CHECK_THAT(r.output, !Catch::Contains("/auth/api_keys"));
}

TEST_CASE("check prepares with the replica's parameter types") {
  Deployment d;
  // keys() gets the viewer as jsonb in $2: a query written for a uuid there cannot run.
  d.config["apps"]["inventory"]["channels"]["warehouse"]["keys"] =
      "SELECT id::text FROM inventory.warehouses WHERE id = $2::uuid";
  const auto r = run_outlive({"check", "--config", d.file("params.json")});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("/apps/inventory/channels/warehouse/keys: cannot cast "
                                       "type jsonb to uuid"));
}

TEST_CASE("check reads the environment over the file") {
  Deployment d;
  const std::string path = d.file("env.json");
  const auto r = run_outlive(
      {"check", "--config", path},
      {"OUTLIVE_APPS__INVENTORY__CHANNELS__WAREHOUSE__KEYS=SELECT y FROM inventory.warehouses"});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains(
                           "/apps/inventory/channels/warehouse/keys: column \"y\" does not exist"));
}

TEST_CASE("check reports an unmigrated database and NATS not answering, exit 1") {
  Deployment d;
  d.config["database"] = fresh_database(/*migrated=*/false);
  run_sql(d.config["database"], kInventoryTables);
  d.config["nats"] = {"nats://127.0.0.1:" + std::to_string(outlive::harness::free_port())};
  const auto r =
      run_outlive({"check", "--config", d.file("down.json"), "--nats-timeout-ms", "300"});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("/apps/inventory: \"inventory\" writes live updates to "
                                       "events.outbox, which does not exist."));
  CHECK_THAT(r.output, Catch::Contains("outlive migrate"));
  CHECK_THAT(r.output, Catch::Contains("/nats: "));
}

TEST_CASE("check reports a database it cannot reach at /database") {
  Deployment d;
  d.config["database"] =
      "postgresql://nobody@127.0.0.1:" + std::to_string(outlive::harness::free_port()) + "/x";
  const auto r = run_outlive({"check", "--config", d.file("nodb.json")});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("/database: cannot connect"));
}

TEST_CASE("check exits 2 on a configuration that does not validate") {
  Deployment d;
  d.config["server"] = {{"ping_interval_ms", "fast"}};
  const auto r = run_outlive({"check", "--config", d.file("invalid.json")});
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("/server/ping_interval_ms"));
}

TEST_CASE("serve refuses to start on a broken keys query, naming its path") {
  Deployment d;
  const int port = outlive::harness::free_port();
  d.config["listen"] = "127.0.0.1:" + std::to_string(port);
  d.config["apps"]["inventory"]["channels"]["warehouse"]["keys"] =
      "SELECT x FROM inventory.warehouses WHERE public_id = $1->>'warehouse'";
  const auto r = run_outlive({"serve", "--config", d.file("serve-broken.json")}, {}, 60s);
  INFO(r.output);
  CHECK(r.exit_code == 1);
  // serve's output is its log: one JSON object per line, the failure with its path among them.
  bool named = false, not_starting = false;
  std::stringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    const auto doc = json::parse(line, nullptr, /*allow_exceptions=*/false);
    REQUIRE(doc.is_object());
    named =
        named || (doc.value("path", "") == "/apps/inventory/channels/warehouse/keys" &&
                  doc.value("error", "").find("column \"x\" does not exist") != std::string::npos);
    not_starting = not_starting || doc.value("msg", "") == "not starting";
  }
  CHECK(named);
  CHECK(not_starting);
  CHECK_FALSE(outlive::harness::port_accepts(port));
}

TEST_CASE("serve starts on the same configuration once the query is right") {
  Deployment d;
  const int port = outlive::harness::free_port();
  d.config["listen"] = "127.0.0.1:" + std::to_string(port);
  const std::string dir = outlive::harness::make_temp_dir("outlive-cli-serve-");
  std::ofstream(dir + "/c.json") << d.config.dump();
  outlive::harness::ChildProcess replica({outlive_binary(), "serve", "--config", dir + "/c.json"},
                                         dir + "/log");
  const bool listening = eventually([&] { return outlive::harness::port_accepts(port); }, 30s);
  INFO(outlive::harness::tail_of_file(dir + "/log"));
  CHECK(listening);
  CHECK(replica.running());
  CHECK(WEXITSTATUS(replica.stop()) == 0);
}

TEST_CASE("check reaches every hook channel: ok, a wrong secret and an unreachable URL named") {
  Deployment d;
  const std::string secret = "the hook secret of check_test, long enough";
  int asked = 0;
  HookServer hook(secret, [&](const HookServer::Request& r) -> HookServer::Answer {
    const auto q = json::parse(r.body);
    ++asked;
    if (q.at("op") != "authorize" || !q.at("viewers").empty()) return {400, "{}"};
    return {200, R"({"allowed":[]})"};
  });
  auto& channels = d.config["apps"]["inventory"]["channels"];
  channels["warehouse_hook"] = {{"scope", {{"type", "object"}}}, {"hook", {{"url", hook.url()}}}};
  d.config["hook_secret_file"] = write_temp_file("hook.secret", secret + "\n");
  auto r = run_outlive({"check", "--config", d.file("hooks.json")});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(asked == 1);
  CHECK_THAT(r.output, Catch::Contains("ok (7 statements prepared"));  // the hook channel has none

  d.config["hook_secret_file"] = write_temp_file("wrong.secret", "not the hook's secret");
  r = run_outlive({"check", "--config", d.file("wrong.json")});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("/apps/inventory/channels/warehouse_hook/hook: hook POST " +
                                       hook.url() + ": status 401"));

  const std::string gone = "http://127.0.0.1:1/outlive/hooks";
  channels["warehouse_hook"]["hook"]["url"] = gone;
  d.config["hook_secret_file"] = write_temp_file("hook2.secret", secret);
  r = run_outlive({"check", "--config", d.file("gone.json")});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("/apps/inventory/channels/warehouse_hook/hook: hook POST " +
                                       gone + ": connecting"));
}

TEST_CASE("check asks auth.hook about no credentials per app: ok, a malformed answer named") {
  Deployment d;
  const std::string secret = "the session hook secret of check_test";
  std::vector<std::string> apps;
  std::string answer = R"({"results":{}})";
  HookServer hook(secret, [&](const HookServer::Request& r) -> HookServer::Answer {
    const auto q = json::parse(r.body);
    apps.push_back(q.at("app"));
    if (!q.at("credentials").empty()) return {400, "{}"};
    return {200, answer};
  });
  d.config["auth"] = {{"hook", {{"url", hook.url()}}}};
  d.config["hook_secret_file"] = write_temp_file("auth-hook.secret", secret);
  auto r = run_outlive({"check", "--config", d.file("auth-hook.json")});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(apps == std::vector<std::string>(1, "inventory"));
  CHECK_THAT(r.output, Catch::Contains("ok (4 statements prepared"));  // no credential queries

  answer = R"({"allowed":[]})";
  r = run_outlive({"check", "--config", d.file("auth-hook-bad.json")});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("/auth/hook: app inventory: the answer has no \"results\" object"));
}
