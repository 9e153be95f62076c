// SPEC 2.2 / 2.3: the C++ writer API (LiveDefinition) against a real PostgreSQL and the real
// inventory event schema.
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "harness/process.hpp"
#include "outbox/live.hpp"
#include "support/services.hpp"

namespace {

using Catch::Matchers::Contains;
using nlohmann::json;
using outlive::Errc;
using outlive::outbox::LiveDefinition;
using outlive::outbox::Update;
using outlive::testing::fresh_database;
using outlive::testing::source_path;

LiveDefinition inventory() {
  return LiveDefinition::from_schema_file("inventory", source_path("schemas/inventory.event.json"));
}

json item(const std::string& id, int quantity) {
  return {{"type", "item.changed"}, {"itemId", id}, {"quantity", quantity}};
}

// Update{key, data} without the coalesce key (spelled out: -Wmissing-field-initializers).
Update update(std::string key, json data, std::optional<std::string> coalesce_key = std::nullopt) {
  return Update{std::move(key), std::move(data), std::move(coalesce_key)};
}

std::string repeat(const std::string& part, size_t times) {
  std::string out;
  for (size_t i = 0; i < times; ++i) out += part;
  return out;
}

struct Row {
  std::string app_id;
  std::string topic;
  std::string key;
  json envelope;
  std::optional<std::string> coalesce_key;
};

std::vector<Row> outbox_rows(const std::string& url) {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  std::vector<Row> rows;
  for (const auto& r : tx.exec("SELECT app_id, topic, key, envelope::text, coalesce_key FROM "
                               "events.outbox ORDER BY position")) {
    Row row{r[0].as<std::string>(), r[1].as<std::string>(), r[2].as<std::string>(),
            json::parse(r[3].as<std::string>()), std::nullopt};
    if (!r[4].is_null()) row.coalesce_key = r[4].as<std::string>();
    rows.push_back(std::move(row));
  }
  return rows;
}

long long count_in(pqxx::transaction_base& tx) {
  return tx.exec("SELECT count(*) FROM events.outbox")[0][0].as<long long>();
}

// The outlive::Error that `f` throws, or nullopt when it throws nothing.
std::optional<outlive::Error> error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const outlive::Error& e) {
    return e;
  }
  return std::nullopt;
}

class WakeListener : public pqxx::notification_receiver {
 public:
  explicit WakeListener(pqxx::connection_base& c)
      : pqxx::notification_receiver(c, "outlive_wake") {}
  void operator()(const std::string& payload, int) override { payloads.push_back(payload); }
  std::vector<std::string> payloads;
};

bool await_payloads(pqxx::connection& conn, WakeListener& listener, size_t count,
                    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (listener.payloads.size() < count) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    conn.await_notification(0, 100000);
  }
  return true;
}

}  // namespace

TEST_CASE("publish writes one update with envelope {v, k, d}", "[writer]") {
  const auto url = fresh_database();
  const auto live = inventory();
  CHECK(live.app_id() == "inventory");
  const json changed = item("i1", 3);
  const json deleted = {{"type", "item.deleted"}, {"itemId", "i2"}};
  {
    pqxx::connection c(url);
    pqxx::work tx(c);
    live.publish(tx, update("warehouse:w1", changed));
    live.publish(tx, update("warehouse:w1", deleted));
    tx.commit();
  }
  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].app_id == "inventory");
  CHECK(rows[0].topic == "live");
  CHECK(rows[0].key == "warehouse:w1");
  CHECK(rows[0].envelope == json{{"v", 1}, {"k", "warehouse:w1"}, {"d", changed}});
  CHECK_FALSE(rows[0].coalesce_key.has_value());
  CHECK(rows[1].envelope == json{{"v", 1}, {"k", "warehouse:w1"}, {"d", deleted}});
}

TEST_CASE(
    "publish refuses data that violates the event schema, naming the failing path, writing nothing",
    "[writer][schema]") {
  const auto url = fresh_database();
  const auto live = inventory();

  struct Case {
    const char* what;
    json data;
    const char* named;  // a part of the message that names the failing path or property
  };
  const std::vector<Case> cases = {
      {"missing itemId", {{"type", "item.changed"}, {"quantity", 1}}, "itemId"},
      {"quantity of the wrong type",
       {{"type", "item.changed"}, {"itemId", "i1"}, {"quantity", "3"}},
       "/quantity"},
      {"negative quantity",
       {{"type", "item.changed"}, {"itemId", "i1"}, {"quantity", -1}},
       "/quantity"},
      {"unknown property",
       {{"type", "item.changed"}, {"itemId", "i1"}, {"colour", "red"}},
       "colour"},
      {"unknown type", {{"type", "item.exploded"}, {"itemId", "i1"}}, "/type"},
      {"empty itemId", {{"type", "item.changed"}, {"itemId", ""}}, "/itemId"},
      {"quantity on item.deleted",
       {{"type", "item.deleted"}, {"itemId", "i1"}, {"quantity", 2}},
       "quantity"},
      {"not an object", json::array({1}), "/"},
  };

  pqxx::connection c(url);
  {
    pqxx::work tx(c);
    live.publish(
        tx, update("w1", item("i0", 1)));  // a valid update earlier in the caller's transaction
    for (const auto& k : cases) {
      INFO(k.what << ": " << k.data.dump());
      const auto e = error_of([&] { live.publish(tx, update("w1", k.data)); });
      REQUIRE(e.has_value());
      INFO("message: " << e->what());
      CHECK(e->code() == Errc::invalid_input);
      CHECK_THAT(e->what(), Contains("inventory") && Contains(k.named));
      // refused before anything was written: only the earlier update is in the transaction
      CHECK(count_in(tx) == 1);
      CHECK_THROWS_AS(live.validate(k.data), outlive::Error);
    }
    // the caller aborts its transaction
    tx.abort();
  }
  CHECK(outbox_rows(url).empty());
  CHECK_NOTHROW(live.validate(item("i1", 0)));
}

TEST_CASE("publish refuses keys outside 1..600 characters and coalesce keys over 600", "[writer]") {
  const auto url = fresh_database();
  const auto live = inventory();
  pqxx::connection c(url);

  struct Case {
    const char* what;
    Update update;
  };
  const std::vector<Case> cases = {
      {"601-character key", update(repeat("k", 601), item("i1", 1))},
      {"empty key", update("", item("i1", 1))},
      {"601-character coalesce key", update("w1", item("i1", 1), repeat("c", 601))},
  };
  for (const auto& k : cases) {
    INFO(k.what);
    {
      pqxx::work tx(c);
      live.publish(tx, update("earlier", item("i0", 1)));
      const auto e = error_of([&] { live.publish(tx, k.update); });
      REQUIRE(e.has_value());
      INFO("message: " << e->what());
      CHECK(e->code() == Errc::invalid_input);
      tx.abort();
    }
    CHECK(outbox_rows(url).empty());
  }

  {
    pqxx::work tx(c);
    live.publish(tx, update(repeat("k", 600), item("i1", 1), repeat("c", 600)));
    tx.commit();
  }
  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].key == repeat("k", 600));
  CHECK(rows[0].coalesce_key == repeat("c", 600));
}

TEST_CASE("publish with a coalesce key coalesces the updates of one transaction",
          "[writer][coalesce]") {
  const auto url = fresh_database();
  const auto live = inventory();
  pqxx::connection c(url);
  {
    pqxx::work tx(c);
    live.publish(tx, update("w1", item("i1", 1), std::string("stock:i1")));
    live.publish(tx, update("w1", item("i2", 5)));  // no coalesce key: its own update
    live.publish(tx, update("w1", item("i1", 2), std::string("stock:i1")));
    live.publish(tx, update("w1", item("i1", 3), std::string("stock:i1")));
    tx.commit();
  }
  {
    pqxx::work tx(c);
    live.publish(tx, update("w1", item("i1", 4), std::string("stock:i1")));  // another transaction
    tx.commit();
  }
  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].envelope["d"] == item("i1", 3));
  CHECK(rows[0].coalesce_key == std::optional<std::string>("stock:i1"));
  CHECK(rows[1].envelope["d"] == item("i2", 5));
  CHECK(rows[2].envelope["d"] == item("i1", 4));
}

TEST_CASE("publish of data larger than 32 KiB writes a resync update", "[writer]") {
  const auto url = fresh_database();
  const auto live = inventory();
  {
    pqxx::connection c(url);
    pqxx::work tx(c);
    live.publish(tx, update("w1", {{"type", "item.changed"}, {"itemId", repeat("i", 40000)}}));
    tx.commit();
  }
  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].envelope == json{{"v", 1}, {"k", "w1"}, {"resync", "oversized"}});
}

TEST_CASE("publish_access writes the access update, then the data update", "[writer][access]") {
  const auto url = fresh_database();
  const auto live = inventory();
  pqxx::connection c(url);
  {
    pqxx::work tx(c);
    live.publish_access(tx, "w1");
    live.publish_access(tx, "w2", item("i1", 9));
    tx.commit();
  }
  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].key == "w1");
  CHECK(rows[0].envelope == json{{"v", 1}, {"k", "w1"}, {"access", true}});
  CHECK(rows[1].key == "w2");
  CHECK(rows[1].envelope == json{{"v", 1}, {"k", "w2"}, {"access", true}});
  CHECK(rows[2].key == "w2");
  CHECK(rows[2].envelope == json{{"v", 1}, {"k", "w2"}, {"d", item("i1", 9)}});
  for (const auto& row : rows) CHECK(row.app_id == "inventory");

  // invalid data: refused before anything is written, not even the access update
  {
    pqxx::work tx(c);
    const auto e = error_of([&] { live.publish_access(tx, "w3", json{{"type", "item.changed"}}); });
    REQUIRE(e.has_value());
    CHECK(e->code() == Errc::invalid_input);
    CHECK_THAT(e->what(), Contains("itemId"));
    CHECK(count_in(tx) == 3);
    tx.abort();
  }
  // an invalid key is refused too
  {
    pqxx::work tx(c);
    const auto e = error_of([&] { live.publish_access(tx, repeat("k", 601)); });
    REQUIRE(e.has_value());
    CHECK(e->code() == Errc::invalid_input);
    tx.abort();
  }
  CHECK(outbox_rows(url).size() == 3);
}

TEST_CASE("wake notifies the replicas on outlive_wake", "[writer][wake]") {
  const auto url = fresh_database();
  const auto live = inventory();
  pqxx::connection listen_conn(url);
  WakeListener listener(listen_conn);

  pqxx::connection c(url);
  {
    pqxx::work tx(c);
    live.publish(tx, update("w1", item("i1", 1)));
    tx.commit();
  }
  live.wake(c);
  REQUIRE(await_payloads(listen_conn, listener, 1));
  CHECK(listener.payloads == std::vector<std::string>{"inventory"});
}

TEST_CASE("LiveDefinition refuses an invalid app id", "[writer]") {
  const json schema = json::parse(std::ifstream(source_path("schemas/inventory.event.json")));
  const std::string schema_path = source_path("schemas/inventory.event.json");
  const std::vector<std::string> invalid = {"Inventory", "-x", "", "a_b", "a" + repeat("b", 63)};
  for (const auto& app : invalid) {
    INFO("app id \"" << app << "\"");
    auto e = error_of([&] { (void)LiveDefinition(app, schema); });
    REQUIRE(e.has_value());
    CHECK(e->code() == Errc::invalid_input);
    e = error_of([&] { (void)LiveDefinition::from_schema_file(app, schema_path); });
    REQUIRE(e.has_value());
    CHECK(e->code() == Errc::invalid_input);
  }
  for (const auto& app : std::vector<std::string>{"inventory", "a", "0-9", "a" + repeat("b", 62)}) {
    INFO("app id \"" << app << "\"");
    CHECK(LiveDefinition(app, schema).app_id() == app);
  }
}

TEST_CASE("from_schema_file refuses a missing or unreadable schema file", "[writer]") {
  const std::string dir = outlive::harness::make_temp_dir("outlive-writer-test-");
  auto e = error_of(
      [&] { (void)LiveDefinition::from_schema_file("inventory", dir + "/missing.event.json"); });
  REQUIRE(e.has_value());
  CHECK(e->code() == Errc::invalid_input);
  CHECK_THAT(e->what(), Contains("missing.event.json"));

  const std::string not_json = dir + "/broken.event.json";
  std::ofstream(not_json) << "{ \"type\": ";
  e = error_of([&] { (void)LiveDefinition::from_schema_file("inventory", not_json); });
  REQUIRE(e.has_value());
  CHECK(e->code() == Errc::invalid_input);
  CHECK_THAT(e->what(), Contains("broken.event.json"));
  outlive::harness::remove_tree(dir);
}

TEST_CASE("publish on a database without the outbox throws not_migrated", "[writer]") {
  const auto url = fresh_database(false);
  const auto live = inventory();
  pqxx::connection c(url);
  pqxx::work tx(c);
  const auto e = error_of([&] { live.publish(tx, update("w1", item("i1", 1))); });
  REQUIRE(e.has_value());
  INFO("message: " << e->what());
  CHECK(e->code() == Errc::not_migrated);
}
