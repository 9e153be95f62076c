// Configuration from the environment (SPEC 6 rev 3): OUTLIVE_ + the field's path joined by `__`.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "config/config.hpp"
#include "config/environment.hpp"

using nlohmann::json;
using outlive::config::Environment;
using outlive::config::load_file;

namespace {

json example() {
  std::ifstream in(std::string(OUTLIVE_SOURCE_DIR) + "/examples/inventory/outlive.json");
  return json::parse(in);
}

std::string write(const std::string& name, const std::string& text) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("outlive-env-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

outlive::config::Config load(const json& doc, const Environment& env) {
  return load_file(write("config.json", doc.dump()), env);
}

std::string error_of(const json& doc, const Environment& env) {
  try {
    load(doc, env);
  } catch (const outlive::Error& e) {
    CHECK(e.code() == outlive::Errc::invalid_input);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a nested field is set from the environment, over the file") {
  auto doc = example();
  doc["server"] = {{"ping_interval_ms", 20000}};
  CHECK(load(doc, {}).server.ping_interval == std::chrono::milliseconds(20000));
  const auto c = load(doc, {{"OUTLIVE_SERVER__PING_INTERVAL_MS", "30000"}});
  CHECK(c.server.ping_interval == std::chrono::milliseconds(30000));
  // A section the file does not have is created.
  doc.erase("server");
  CHECK(load(doc, {{"OUTLIVE_SERVER__IDLE_TIMEOUT_MS", "90000"}}).server.idle_timeout ==
        std::chrono::milliseconds(90000));
}

TEST_CASE("an array is set from the environment as JSON") {
  const auto c =
      load(example(),
           {{"OUTLIVE_APPS__INVENTORY__ALLOWED_ORIGINS", R"(["http://x", "https://y.example"])"}});
  CHECK(c.apps.at("inventory").allowed_origins ==
        std::vector<std::string>{"http://x", "https://y.example"});
  const auto trusted = load(example(), {{"OUTLIVE_TRUSTED_PROXIES", R"(["10.0.0.0/8"])"}});
  CHECK(trusted.trusted_proxies == std::vector<std::string>{"10.0.0.0/8"});
}

TEST_CASE("path segments match the file's keys in any case, and new keys are lower case") {
  auto doc = example();
  auto channel = doc["apps"]["inventory"]["channels"]["my_warehouses"];
  doc["apps"]["inventory"]["channels"].erase("my_warehouses");
  doc["apps"]["inventory"]["channels"]["myWarehouses"] = channel;
  const auto c =
      load(doc, {{"OUTLIVE_APPS__INVENTORY__CHANNELS__MYWAREHOUSES__COLLECTION", "false"}});
  const auto& channels = c.apps.at("inventory").channels;
  REQUIRE(channels.count("myWarehouses") == 1);
  CHECK_FALSE(channels.at("myWarehouses").collection);
  CHECK(channels.count("mywarehouses") == 0);

  const auto added = load(example(), {{"OUTLIVE_APPS__NOTES", "{}"}});
  CHECK(added.apps.count("notes") == 1);

  doc["apps"]["inventory"]["channels"]["MyWarehouses"] = channel;
  CHECK_THAT(
      error_of(doc, {{"OUTLIVE_APPS__INVENTORY__CHANNELS__MYWAREHOUSES__COLLECTION", "true"}}),
      Catch::Contains("matches both"));
}

TEST_CASE("values are JSON, else plain strings, and a string field keeps the text") {
  auto doc = example();
  CHECK(load(doc, {{"OUTLIVE_REPLICA", "r7"}}).replica == "r7");
  CHECK(load(doc, {{"OUTLIVE_REPLICA", "123"}}).replica == "123");
  CHECK(load(doc, {{"OUTLIVE_AUTH__SESSION_COOKIE", R"("sid")"}}).auth.session_cookie == "sid");
  CHECK(load(doc, {{"OUTLIVE_SERVER__IO_URING", "false"}}).server.io_uring == false);
  // Empty is unset (compose's `VAR=`).
  CHECK(load(doc, {{"OUTLIVE_REPLICA", ""}}).replica == "r1");
}

TEST_CASE("a wrong value from the environment names the path and the variable") {
  const auto msg = error_of(example(), {{"OUTLIVE_SERVER__PING_INTERVAL_MS", "fast"}});
  CHECK_THAT(msg, Catch::Contains("/server/ping_interval_ms"));
  CHECK_THAT(msg, Catch::Contains("OUTLIVE_SERVER__PING_INTERVAL_MS"));
  const auto misspelled = error_of(example(), {{"OUTLIVE_SERVR__PING_INTERVAL_MS", "30000"}});
  CHECK_THAT(misspelled, Catch::Contains("servr"));
  CHECK_THAT(misspelled, Catch::Contains("OUTLIVE_SERVR__PING_INTERVAL_MS"));
  CHECK_THAT(error_of(example(), {{"OUTLIVE_SERVER____X", "1"}}), Catch::Contains("empty"));
  CHECK_THAT(error_of(example(), {{"OUTLIVE_REPLICA__X", "1"}}), Catch::Contains("not an object"));
}

TEST_CASE("OUTLIVE_LOG__LEVEL sets log.level, and a wrong one is refused naming it") {
  CHECK(load(example(), {{"OUTLIVE_LOG__LEVEL", "warn"}}).log_level == "warn");
  CHECK(load(example(), {}).log_level == "info");
  auto doc = example();
  doc["log"] = {{"level", "error"}};
  CHECK(load(doc, {{"OUTLIVE_LOG__LEVEL", "debug"}}).log_level == "debug");
  CHECK_THAT(error_of(example(), {{"OUTLIVE_LOG__LEVEL", "loud"}}), Catch::Contains("/log/level"));
}

TEST_CASE("variables that are not configuration are left alone") {
  const auto c = load(example(), {{"OUTLIVE_LOG_LEVEL", "debug"}, {"OUTLIVE_IO_URING", "0"}});
  CHECK(c.replica == "r1");
}

TEST_CASE("OUTLIVE_DATABASE_URL, OUTLIVE_NATS_URL and OUTLIVE_LISTEN keep working") {
  const auto c = load(example(), {{"OUTLIVE_DATABASE_URL", "postgresql://a@db/x"},
                                  {"OUTLIVE_LISTEN", "0.0.0.0:9000"},
                                  {"OUTLIVE_NATS_URL", "nats://n1:4222,nats://n2:4222"}});
  CHECK(c.database == "postgresql://a@db/x");
  CHECK(c.listen == "0.0.0.0:9000");
  CHECK(c.nats == std::vector<std::string>{"nats://n1:4222", "nats://n2:4222"});
  // A file without database is complete once the environment gives it.
  auto doc = example();
  doc.erase("database");
  CHECK(load(doc, {{"OUTLIVE_DATABASE", "postgresql://b@db/y"}}).database == "postgresql://b@db/y");
  CHECK_THAT(error_of(doc, {}), Catch::Contains("database"));
}

TEST_CASE("OUTLIVE_DATABASE_URL_FILE reads the URL from a secret file") {
  const auto secret = write("database-url", "postgresql://outlive:s3cret@db/app\n");
  auto doc = example();
  doc.erase("database");
  CHECK(load(doc, {{"OUTLIVE_DATABASE_URL_FILE", secret}}).database ==
        "postgresql://outlive:s3cret@db/app");
  CHECK_THAT(error_of(doc, {{"OUTLIVE_DATABASE_URL_FILE", "/nonexistent/secret"}}),
             Catch::Contains("/nonexistent/secret"));
  CHECK_THAT(error_of(doc, {{"OUTLIVE_DATABASE_URL_FILE", secret},
                            {"OUTLIVE_DATABASE_URL", "postgresql://x@db/y"}}),
             Catch::Contains("set one of them"));
}

TEST_CASE("replica defaults to the host name") {
  auto doc = example();
  doc.erase("replica");
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof host - 1) == 0);
  CHECK(load(doc, {}).replica == std::string(host).substr(0, 64));
  CHECK(load(doc, {{"OUTLIVE_REPLICA", "r2"}}).replica == "r2");
}
