#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "config/config.hpp"
#include "schema/validator.hpp"

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

TEST_CASE("a hook channel is read with its URL and timeout, and needs hook_secret_file") {
  // SPEC 5.4 rev 4: "hook" instead of keys and authorize.
  auto doc = example();
  auto& channel = doc["apps"]["inventory"]["channels"]["warehouse"];
  channel.erase("keys");
  channel.erase("authorize");
  channel["hook"] = {{"url", "http://127.0.0.1:3000/outlive/hooks"}, {"timeout_ms", 1500}};
  doc["hooks"] = {{"max_in_flight", 32}};
  CHECK_THAT(error_of(doc), Catch::Contains("c.json: /apps/inventory/channels/warehouse/hook: needs hook_secret_file"));
  doc["hook_secret_file"] = "hook.secret";
  const auto c = parse(doc);
  const auto& ch = c.apps.at("inventory").channels.at("warehouse");
  REQUIRE(ch.hook);
  CHECK(ch.hook->url == "http://127.0.0.1:3000/outlive/hooks");
  CHECK(ch.hook->timeout == std::chrono::milliseconds(1500));
  CHECK(ch.keys_sql.empty());
  CHECK(c.hooks.max_in_flight == 32);
  CHECK(c.hook_secret_file == "hook.secret");
  channel.erase("hook");
  channel["hook"] = {{"url", "https://hooks.example.com/outlive"}};
  CHECK(parse(doc).apps.at("inventory").channels.at("warehouse").hook->timeout ==
        std::chrono::milliseconds(2000));

  // hook_secret_file and hooks alone are accepted.
  auto top = example();
  top["hook_secret_file"] = "hook.secret";
  top["hooks"] = {{"max_in_flight", 32}};
  CHECK_NOTHROW(parse(top));

  // Both kinds at once, a hook without url, a url that is not http(s), a timeout out of range and
  // an unknown field of hook fail validation, naming the channel.
  auto both = example();
  both["apps"]["inventory"]["channels"]["warehouse"]["hook"] = {{"url", "http://x"}};
  CHECK_THAT(error_of(both), Catch::Contains("/apps/inventory/channels/warehouse"));
  for (const json& hook : {json{{"timeout_ms", 10}}, json{{"url", "ftp://x"}},
                           json{{"url", "http://x"}, {"timeout_ms", 10001}},
                           json{{"url", "http://x"}, {"colour", "red"}}}) {
    auto bad = example();
    auto& ch = bad["apps"]["inventory"]["channels"]["warehouse"];
    ch.erase("keys");
    ch.erase("authorize");
    ch["hook"] = hook;
    const auto m = error_of(bad);
    CHECK_THAT(m, Catch::Contains("/apps/inventory/channels/warehouse"));
  }
  auto zero = example();
  zero["hooks"] = {{"max_in_flight", 0}};
  CHECK_THAT(error_of(zero), Catch::Contains("/hooks/max_in_flight"));
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

TEST_CASE("rev 2 fields default to SPEC 6.1's values") {
  const auto c = parse(example());
  CHECK(c.trusted_proxies == std::vector<std::string>{"127.0.0.0/8", "::1"});
  CHECK(c.server.max_connections == 100000);
  CHECK(c.server.io_threads == 0);
  CHECK(c.server.ping_interval == std::chrono::milliseconds(25000));
  CHECK(c.server.idle_timeout == std::chrono::milliseconds(60000));
  CHECK(c.server.db_pool_size == 8);
  CHECK(c.server.db_pool_queue == 16384);
  CHECK(c.server.db_backend_heap_prime == 4 * 1024 * 1024);
  CHECK(c.access.max_decisions == 1000000);
  CHECK(c.access.decision_lifetime == std::chrono::milliseconds(300000));
}

TEST_CASE("rev 2 fields are read") {
  auto doc = example();
  doc["trusted_proxies"] = {"10.0.0.0/8", "192.168.1.7", "fd00::/8", "::1/128"};
  doc["server"] = {
      {"max_connections", 5000},         {"io_threads", 3},    {"ping_interval_ms", 1000},
      {"idle_timeout_ms", 2500},         {"db_pool_size", 16}, {"db_pool_queue", 64},
      {"db_backend_heap_prime_bytes", 0}};
  doc["access"] = {{"max_decisions", 42}};
  const auto c = parse(doc);
  CHECK(c.trusted_proxies ==
        std::vector<std::string>{"10.0.0.0/8", "192.168.1.7", "fd00::/8", "::1/128"});
  CHECK(c.server.max_connections == 5000);
  CHECK(c.server.io_threads == 3);
  CHECK(c.server.ping_interval == std::chrono::milliseconds(1000));
  CHECK(c.server.idle_timeout == std::chrono::milliseconds(2500));
  CHECK(c.server.db_pool_size == 16);
  CHECK(c.server.db_pool_queue == 64);
  CHECK(c.server.db_backend_heap_prime == 0);
  CHECK(c.access.max_decisions == 42);
  CHECK(c.access.decision_lifetime == std::chrono::milliseconds(300000));  // untouched
  doc["trusted_proxies"] = json::array();  // nobody's header is believed
  CHECK(parse(doc).trusted_proxies.empty());
}

TEST_CASE("bad rev 2 values are refused, naming their path") {
  auto with = [](const json& patch) {
    auto doc = example();
    doc.merge_patch(patch);
    return error_of(doc);
  };
  CHECK_THAT(with({{"server", {{"max_connections", 0}}}}),
             Catch::Contains("/server/max_connections"));
  CHECK_THAT(with({{"server", {{"io_threads", -1}}}}), Catch::Contains("/server/io_threads"));
  CHECK_THAT(with({{"server", {{"ping_interval_ms", 99}}}}),
             Catch::Contains("/server/ping_interval_ms"));
  CHECK_THAT(with({{"server", {{"idle_timeout_ms", 99}}}}),
             Catch::Contains("/server/idle_timeout_ms"));
  CHECK_THAT(with({{"server", {{"db_pool_size", 0}}}}), Catch::Contains("/server/db_pool_size"));
  CHECK_THAT(with({{"server", {{"db_pool_size", 257}}}}), Catch::Contains("/server/db_pool_size"));
  CHECK_THAT(with({{"server", {{"db_pool_size", "8"}}}}), Catch::Contains("/server/db_pool_size"));
  CHECK_THAT(with({{"server", {{"db_pool_queue", 0}}}}), Catch::Contains("/server/db_pool_queue"));
  CHECK_THAT(with({{"server", {{"db_pool_queue", 1000001}}}}),
             Catch::Contains("/server/db_pool_queue"));
  CHECK_THAT(with({{"server", {{"db_backend_heap_prime_bytes", -1}}}}),
             Catch::Contains("/server/db_backend_heap_prime_bytes"));
  CHECK_THAT(with({{"server", {{"db_backend_heap_prime_bytes", 67108865}}}}),
             Catch::Contains("/server/db_backend_heap_prime_bytes"));
  CHECK(with({{"server", {{"db_backend_heap_prime_bytes", 67108864}}}}).empty());
  CHECK_THAT(with({{"server", {{"colour", "red"}}}}), Catch::Contains("/server"));
  CHECK_THAT(with({{"access", {{"max_decisions", 0}}}}), Catch::Contains("/access/max_decisions"));
  CHECK_THAT(with({{"trusted_proxies", "127.0.0.1"}}), Catch::Contains("/trusted_proxies"));
  CHECK_THAT(with({{"trusted_proxies", {"127.0.0.1", "gateway"}}}),
             Catch::Contains("/trusted_proxies/1"));
  CHECK_THAT(with({{"trusted_proxies", {"10.0.0.0/33"}}}), Catch::Contains("/trusted_proxies/0"));
  CHECK_THAT(with({{"trusted_proxies", {"1.2.3"}}}), Catch::Contains("/trusted_proxies/0"));
  CHECK_THAT(with({{"trusted_proxies", {"::1/129"}}}), Catch::Contains("/trusted_proxies/0"));
  // A tab pinged less often than the idle timeout would be dropped while healthy.
  CHECK_THAT(with({{"server", {{"ping_interval_ms", 60000}}}}),
             Catch::Contains("/server/idle_timeout_ms"));
  CHECK_THAT(with({{"server", {{"ping_interval_ms", 1000}, {"idle_timeout_ms", 1000}}}}),
             Catch::Contains("idle_timeout_ms"));
}

TEST_CASE("log.level is one of debug, info, warn and error, info when not given") {
  CHECK(parse(example()).log_level == "info");
  for (const std::string level : {"debug", "info", "warn", "error"}) {
    auto doc = example();
    doc["log"] = {{"level", level}};
    CHECK(parse(doc).log_level == level);
  }
  for (const json& wrong : {json("WARN"), json("loud"), json(""), json(2)}) {
    INFO(wrong.dump());
    auto doc = example();
    doc["log"] = {{"level", wrong}};
    const auto msg = error_of(doc);
    CHECK_THAT(msg, Catch::Contains("c.json") && Catch::Contains("/log/level"));
  }
  auto unknown = example();
  unknown["log"] = {{"format", "text"}};
  CHECK_THAT(error_of(unknown), Catch::Contains("/log"));
}

TEST_CASE("a scope schema valijson would recurse on without end is refused, naming its path") {
  auto with_scope = [](const json& scope) {
    auto doc = example();
    doc["apps"]["inventory"]["channels"]["warehouse"]["scope"] = scope;
    return error_of(doc);
  };
  // Found by tests/fuzz/fuzz_config: each of these exhausted the stack.
  for (const auto& scope : {json{{"$ref", "#"}}, json::parse(R"({"not": {"$ref": "#/not"}})"),
                            json::parse(R"({"allOf": [{"$ref": "#/allOf/0/"}]})"),
                            json::parse(R"({"definitions": {"a": {"$ref": "#/definitions/b"},
                                                            "b": {"$ref": "#/definitions/a"}},
                                            "$ref": "#/definitions/a"})"),
                            json::parse(R"({"$id": "http://x/y.json",
                                            "definitions": {"a": {"$ref": "y.json#/definitions/a"}},
                                            "$ref": "#/definitions/a"})")}) {
    INFO(scope.dump());
    const auto msg = with_scope(scope);
    CHECK_THAT(msg, Catch::Contains("/apps/inventory/channels/warehouse/scope"));
    CHECK_THAT(msg, Catch::Contains("leads back to itself"));
  }
  json deep = json::object();
  for (int i = 0; i < 64; ++i) deep = json{{"not", deep}};
  CHECK_THAT(with_scope(deep), Catch::Contains("nested deeper than 64 levels"));
  // A schema that refers to itself through a property is a recursive schema, not a cycle, and a
  // $ref may lead through other $refs.
  CHECK(with_scope(json::parse(R"({"type": "object", "properties": {"child": {"$ref": "#"}}})"))
            .empty());
  CHECK(with_scope(json::parse(R"({"definitions": {"a": {"$ref": "#/definitions/b"},
                                                   "b": {"type": "object"}},
                                   "$ref": "#/definitions/a"})"))
            .empty());
  json nested = json::object();
  for (int i = 0; i < 63; ++i) nested = json{{"not", nested}};
  CHECK(with_scope(nested).empty());
}

TEST_CASE("an anyOf whose alternatives name each other by place is a valid scope schema") {
  // Alone, alternative 1 would be #/anyOf/0 and name itself; alternative 0 would name nothing.
  auto doc = example();
  for (const auto* scope : {R"({"anyOf": [{"type": "object"}, {"$ref": "#/anyOf/0"}]})",
                            R"({"anyOf": [{"$ref": "#/anyOf/1"}, {"type": "object"}]})"}) {
    INFO(scope);
    doc["apps"]["inventory"]["channels"]["warehouse"]["scope"] = json::parse(scope);
    CHECK(error_of(doc).empty());
    outlive::schema::Validator validator(json::parse(scope));
    CHECK_FALSE(validator.check(json::object()));
    CHECK(validator.check(json("a string")));
  }
}

TEST_CASE("nats_options carries NATS credentials and TLS, and tls:// URLs are accepted") {
  auto doc = example();
  doc["nats"] = {"tls://10.0.0.1:4222", "nats://10.0.0.2:4222"};
  doc["nats_options"] = {
      {"user", "outlive"},
      {"password_file", "/run/secrets/nats_password"},
      {"tls", {{"ca_file", "ca.pem"}, {"cert_file", "c.pem"}, {"key_file", "k.pem"}}}};
  const auto c = parse(doc);
  CHECK(c.nats.front() == "tls://10.0.0.1:4222");
  CHECK(c.nats_options.user == "outlive");
  CHECK(c.nats_options.password_file == "/run/secrets/nats_password");
  CHECK(c.nats_options.tls);
  CHECK(c.nats_options.tls_ca_file == "ca.pem");
  CHECK(c.nats_options.tls_cert_file == "c.pem");
  CHECK(c.nats_options.tls_key_file == "k.pem");

  // Without the object: no credentials, plaintext.
  const auto plain = parse(example());
  CHECK(plain.nats_options.user.empty());
  CHECK_FALSE(plain.nats_options.wants_tls());

  for (const json& alone :
       {json{{"user", "u"}, {"password", "p"}}, json{{"token", "t"}}, json{{"token_file", "t"}},
        json{{"creds_file", "x.creds"}}, json{{"tls", json::object()}},
        json{{"nkey", "U" + std::string(55, 'A')}, {"nkey_seed_file", "seed.nk"}}}) {
    INFO(alone.dump());
    doc["nats_options"] = alone;
    CHECK(error_of(doc).empty());
  }
}

TEST_CASE("nats_options refuses unknown fields and incomplete pairs, naming the path") {
  auto with = [](const json& nats_options) {
    auto doc = example();
    doc["nats_options"] = nats_options;
    return error_of(doc);
  };
  CHECK_THAT(with({{"user", "u"}, {"pasword", "p"}}), Catch::Contains("/nats_options"));
  CHECK_THAT(with({{"tls", {{"ca", "ca.pem"}}}}), Catch::Contains("/nats_options/tls"));
  CHECK_THAT(with({{"password", "p"}}), Catch::Contains("/nats_options"));
  CHECK_THAT(with({{"nkey_seed_file", "seed.nk"}}), Catch::Contains("/nats_options"));
  CHECK_THAT(with({{"nkey", "not-a-public-key"}, {"nkey_seed_file", "s"}}),
             Catch::Contains("/nats_options/nkey"));
  CHECK_THAT(with({{"tls", {{"cert_file", "c.pem"}}}}), Catch::Contains("/nats_options/tls"));
  CHECK_THAT(with({{"user", ""}}), Catch::Contains("/nats_options/user"));
  CHECK_THAT(with("user:pass"), Catch::Contains("/nats_options"));
  auto doc = example();
  doc["nats"] = {"http://127.0.0.1:4222"};
  CHECK_THAT(error_of(doc), Catch::Contains("/nats/0"));
}

TEST_CASE("load_file resolves NATS secret files against the configuration's folder") {
  auto doc = example();
  doc["nats_options"] = {{"token_file", "secrets/nats_token"},
                         {"tls", {{"ca_file", "/etc/ssl/nats-ca.pem"}}}};
  const std::string path = "/tmp/outlive-config-test-" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << doc.dump();
  const auto c = outlive::config::load_file(path);
  std::remove(path.c_str());
  CHECK(c.nats_options.token_file == "/tmp/secrets/nats_token");
  CHECK(c.nats_options.tls_ca_file == "/etc/ssl/nats-ca.pem");
}

TEST_CASE("the database URL comes from OUTLIVE_DATABASE_URL or from OUTLIVE_DATABASE_URL_FILE") {
  using outlive::config::database_url_from_environment;
  const std::string file = "/tmp/outlive-db-url-" + std::to_string(::getpid());
  std::ofstream(file) << "postgresql://outlive:secret@db/app\n";
  ::unsetenv("OUTLIVE_DATABASE_URL");
  ::unsetenv("OUTLIVE_DATABASE_URL_FILE");
  CHECK_FALSE(database_url_from_environment());
  ::setenv("OUTLIVE_DATABASE_URL_FILE", file.c_str(), 1);
  CHECK(database_url_from_environment() ==
        std::optional<std::string>("postgresql://outlive:secret@db/app"));
  ::unsetenv("OUTLIVE_DATABASE_URL_FILE");
  ::setenv("OUTLIVE_DATABASE_URL", "postgresql://direct/app", 1);
  CHECK(database_url_from_environment() == std::optional<std::string>("postgresql://direct/app"));
  ::unsetenv("OUTLIVE_DATABASE_URL");
  ::setenv("OUTLIVE_DATABASE_URL_FILE", file.c_str(), 1);
  std::remove(file.c_str());
  try {
    database_url_from_environment();
    FAIL("an unreadable OUTLIVE_DATABASE_URL_FILE was accepted");
  } catch (const outlive::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("OUTLIVE_DATABASE_URL_FILE") && Catch::Contains(file));
  }
  ::unsetenv("OUTLIVE_DATABASE_URL_FILE");
}
