#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "config/config.hpp"

using nlohmann::json;
using outlive::config::parse;

namespace {
json example() {
  std::ifstream in(std::string(OUTLIVE_SOURCE_DIR) + "/examples/inventory/outlive.json");
  return json::parse(in);
}

std::string error_of(const json& doc) {
  try {
    parse(doc, "c.json");
  } catch (const outlive::Error& e) {
    CHECK(e.code() == outlive::Errc::invalid_input);
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("the example configuration of SPEC 6.1 parses") {
  const auto c = parse(example());
  CHECK(c.replica == "r1");
  CHECK(c.nats == std::vector<std::string>{"nats://127.0.0.1:4222"});
  REQUIRE(c.apps.count("inventory") == 1);
  const auto& app = c.apps.at("inventory");
  CHECK(app.channels.at("my_warehouses").collection);
  CHECK_FALSE(app.channels.at("warehouse").collection);
  CHECK(c.auth.session_cookie == "session");
  CHECK(c.publisher.poll == std::chrono::milliseconds(1000));
}

TEST_CASE("an unknown field is refused, naming its path") {
  auto doc = example();
  doc["apps"]["inventory"]["channels"]["warehouse"]["colour"] = "red";
  const auto msg = error_of(doc);
  CHECK_THAT(msg, Catch::Contains("c.json"));
  CHECK_THAT(msg, Catch::Contains("/apps/inventory/channels/warehouse"));
}

TEST_CASE("missing required fields and wrong types are refused") {
  auto no_db = example();
  no_db.erase("database");
  CHECK_THAT(error_of(no_db), Catch::Contains("database"));

  auto bad_nats = example();
  bad_nats["nats"] = "nats://x:1";
  CHECK_THAT(error_of(bad_nats), Catch::Contains("/nats"));

  auto no_keys = example();
  no_keys["apps"]["inventory"]["channels"]["warehouse"].erase("keys");
  CHECK_THAT(error_of(no_keys), Catch::Contains("/apps/inventory/channels/warehouse"));
}

TEST_CASE("app ids follow the SPEC's format on both sides") {
  auto doc = example();
  doc["apps"][std::string(63, 'a')] = json::object();
  CHECK_NOTHROW(parse(doc));
  doc["apps"][std::string(64, 'a')] = json::object();
  CHECK_FALSE(error_of(doc).empty());
  auto upper = example();
  upper["apps"]["Inventory"] = json::object();
  CHECK_FALSE(error_of(upper).empty());
}

TEST_CASE("a lease must outlast the publish timeout") {
  auto doc = example();
  doc["publisher"] = {{"lease_ms", 1000}, {"publish_timeout_ms", 1000}};
  CHECK_THAT(error_of(doc), Catch::Contains("lease_ms"));
  doc["publisher"] = {{"lease_ms", 1001}, {"publish_timeout_ms", 1000}};
  CHECK_NOTHROW(parse(doc));
}
