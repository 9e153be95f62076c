// SPEC 2.1: the rules the database enforces for every writer, shown through plain SQL
// (events.enqueue, events.publish_live, events.wake) on a real PostgreSQL, on both sides of each
// limit.
#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <string>
#include <vector>

#include "support/services.hpp"

namespace {

using Catch::Matchers::Contains;
using nlohmann::json;
using outlive::testing::fresh_database;

// events.enqueue with a fresh id, topic 'live': $1 app, $2 key, $3 envelope, $4 coalesce key.
const std::string kEnqueue =
    "SELECT events.enqueue(gen_random_uuid(), $1::text, 'live', $2::text, $3::jsonb, $4::text)";
// events.publish_live: $1 app, $2 key, $3 data, $4 access, $5 coalesce key.
const std::string kPublish =
    "SELECT events.publish_live($1::text, $2::text, $3::jsonb, $4::boolean, $5::text)";

const char* const kNull = nullptr;  // a NULL parameter

std::string repeat(const std::string& part, size_t times) {
  std::string out;
  out.reserve(part.size() * times);
  for (size_t i = 0; i < times; ++i) out += part;
  return out;
}

// The envelope a writer is meant to build: {"v":1,"k":key,"d":data}.
std::string envelope(const std::string& key, const json& data = json{{"n", 1}}) {
  return json{{"v", 1}, {"k", key}, {"d", data}}.dump();
}

struct Row {
  long long position = 0;
  std::string id;
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
  for (const auto& r :
       tx.exec("SELECT position, id::text, app_id, topic, key, envelope::text, coalesce_key"
               " FROM events.outbox ORDER BY position")) {
    Row row;
    row.position = r[0].as<long long>();
    row.id = r[1].as<std::string>();
    row.app_id = r[2].as<std::string>();
    row.topic = r[3].as<std::string>();
    row.key = r[4].as<std::string>();
    row.envelope = json::parse(r[5].as<std::string>());
    if (!r[6].is_null()) row.coalesce_key = r[6].as<std::string>();
    rows.push_back(std::move(row));
  }
  return rows;
}

long long outbox_count(const std::string& url) {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  return tx.exec("SELECT count(*) FROM events.outbox")[0][0].as<long long>();
}

// Runs one statement in its own transaction and commits. Throws what the statement throws.
template <typename... Args>
void run(const std::string& url, const std::string& statement, const Args&... args) {
  pqxx::connection c(url);
  pqxx::work tx(c);
  tx.exec_params(statement, args...);
  tx.commit();
}

struct Refusal {
  bool refused = false;
  std::string sqlstate;
  std::string message;
  bool outbox_unchanged = false;
};

// Runs `statement` in a transaction that already wrote a valid update, expecting it to fail; then
// tries to commit anyway. Reports the failure and whether the outbox ended as it was before.
template <typename... Args>
Refusal attempt(const std::string& url, const std::string& statement, const Args&... args) {
  const long long before = outbox_count(url);
  Refusal out;
  {
    pqxx::connection c(url);
    pqxx::work tx(c);
    tx.exec("SELECT events.publish_live('inventory', 'written-earlier-in-tx', '{\"n\":0}')");
    try {
      tx.exec_params(statement, args...);
    } catch (const pqxx::sql_error& e) {
      out.refused = true;
      out.sqlstate = e.sqlstate();
      out.message = e.what();
    }
    try {
      tx.commit();  // a failed transaction cannot commit: Postgres rolls it back
    } catch (const std::exception&) {
    }
  }
  out.outbox_unchanged = outbox_count(url) == before;
  return out;
}

// Each refusal: an error with SQLSTATE 22023 (invalid parameter value), nothing written.
#define CHECK_REFUSED(outcome, sqlstate_expected, message_part) \
  do {                                                          \
    const Refusal r_ = (outcome);                               \
    INFO("error: " << r_.message);                              \
    CHECK(r_.refused);                                          \
    CHECK(r_.sqlstate == (sqlstate_expected));                  \
    CHECK_THAT(r_.message, Contains(message_part));             \
    CHECK(r_.outbox_unchanged);                                 \
  } while (0)

// Collects the payloads of NOTIFY on channel outlive_wake.
class WakeListener : public pqxx::notification_receiver {
 public:
  explicit WakeListener(pqxx::connection_base& c)
      : pqxx::notification_receiver(c, "outlive_wake") {}
  void operator()(const std::string& payload, int) override { payloads.push_back(payload); }
  std::vector<std::string> payloads;
};

// Waits until `listener` got at least `count` notifications or `timeout` passed.
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

TEST_CASE("key: 1 to 600 characters accepted, empty, NULL and 601 characters refused",
          "[sql][rules]") {
  const auto url = fresh_database();
  const std::string k600 = repeat("k", 600);
  const std::string k601 = repeat("k", 601);
  // The limit counts characters, not bytes: 600 two-byte characters are 1200 bytes.
  const std::string e600 = repeat("\xc3\xa9", 600);
  const std::string e601 = repeat("\xc3\xa9", 601);

  SECTION("events.enqueue") {
    REQUIRE_NOTHROW(run(url, kEnqueue, "inventory", k600, envelope(k600), kNull));
    REQUIRE_NOTHROW(run(url, kEnqueue, "inventory", "a", envelope("a"), kNull));
    REQUIRE_NOTHROW(run(url, kEnqueue, "inventory", e600, envelope(e600), kNull));
    CHECK_REFUSED(attempt(url, kEnqueue, "inventory", k601, envelope(k601), kNull), "22023",
                  "1 to 600");
    CHECK_REFUSED(attempt(url, kEnqueue, "inventory", e601, envelope(e601), kNull), "22023",
                  "1 to 600");
    CHECK_REFUSED(attempt(url, kEnqueue, "inventory", "", envelope(""), kNull), "22023",
                  "1 to 600");
    CHECK_REFUSED(
        attempt(url, kEnqueue, "inventory", kNull, json{{"v", 1}, {"d", 1}}.dump(), kNull), "22023",
        "1 to 600");
  }
  SECTION("events.publish_live") {
    REQUIRE_NOTHROW(run(url, kPublish, "inventory", k600, R"({"n":1})", false, kNull));
    REQUIRE_NOTHROW(run(url, kPublish, "inventory", "a", R"({"n":1})", false, kNull));
    REQUIRE_NOTHROW(run(url, kPublish, "inventory", e600, R"({"n":1})", false, kNull));
    CHECK_REFUSED(attempt(url, kPublish, "inventory", k601, R"({"n":1})", false, kNull), "22023",
                  "1 to 600");
    CHECK_REFUSED(attempt(url, kPublish, "inventory", e601, R"({"n":1})", false, kNull), "22023",
                  "1 to 600");
    CHECK_REFUSED(attempt(url, kPublish, "inventory", "", R"({"n":1})", false, kNull), "22023",
                  "1 to 600");
    CHECK_REFUSED(attempt(url, kPublish, "inventory", kNull, R"({"n":1})", false, kNull), "22023",
                  "1 to 600");
    // An access update is refused by the same rule.
    CHECK_REFUSED(attempt(url, kPublish, "inventory", k601, kNull, true, kNull), "22023",
                  "1 to 600");
  }

  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].key == k600);
  CHECK(rows[0].envelope["k"] == k600);
  CHECK(rows[1].key == "a");
  CHECK(rows[2].key == e600);
}

TEST_CASE("coalesce key: up to 600 characters accepted, 601 refused", "[sql][rules]") {
  const auto url = fresh_database();
  const std::string c600 = repeat("c", 600);
  const std::string c601 = repeat("c", 601);

  SECTION("events.enqueue") {
    REQUIRE_NOTHROW(run(url, kEnqueue, "inventory", "w1", envelope("w1"), c600));
    CHECK_REFUSED(attempt(url, kEnqueue, "inventory", "w1", envelope("w1"), c601), "22023",
                  "coalesce key");
  }
  SECTION("events.publish_live") {
    REQUIRE_NOTHROW(run(url, kPublish, "inventory", "w1", R"({"n":1})", false, c600));
    CHECK_REFUSED(attempt(url, kPublish, "inventory", "w1", R"({"n":1})", false, c601), "22023",
                  "coalesce key");
  }

  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].coalesce_key == c600);
}

TEST_CASE("envelope: v must be 1 and k must equal the key", "[sql][rules]") {
  const auto url = fresh_database();
  const std::string key = "w1";

  REQUIRE_NOTHROW(run(url, kEnqueue, "inventory", key,
                      json{{"v", 1}, {"k", key}, {"d", {{"n", 1}}}}.dump(), kNull));
  REQUIRE_NOTHROW(run(url, kEnqueue, "inventory", key,
                      json{{"v", 1}, {"k", key}, {"access", true}}.dump(), kNull));

  // without v = 1
  CHECK_REFUSED(attempt(url, kEnqueue, "inventory", key, json{{"k", key}, {"d", 1}}.dump(), kNull),
                "22023", "\"v\": 1");
  CHECK_REFUSED(
      attempt(url, kEnqueue, "inventory", key, json{{"v", 2}, {"k", key}, {"d", 1}}.dump(), kNull),
      "22023", "\"v\": 1");
  CHECK_REFUSED(
      attempt(url, kEnqueue, "inventory", key, json{{"v", 0}, {"k", key}, {"d", 1}}.dump(), kNull),
      "22023", "\"v\": 1");
  CHECK_REFUSED(attempt(url, kEnqueue, "inventory", key,
                        json{{"v", "1"}, {"k", key}, {"d", 1}}.dump(), kNull),
                "22023", "\"v\": 1");
  CHECK_REFUSED(attempt(url, kEnqueue, "inventory", key, R"([{"v":1}])", kNull), "22023",
                "\"v\": 1");
  CHECK_REFUSED(attempt(url, kEnqueue, "inventory", key, kNull, kNull), "22023", "\"v\": 1");
  // k different from the key
  CHECK_REFUSED(
      attempt(url, kEnqueue, "inventory", key, json{{"v", 1}, {"k", "w2"}, {"d", 1}}.dump(), kNull),
      "22023", "\"k\" must equal the key");
  CHECK_REFUSED(attempt(url, kEnqueue, "inventory", key, json{{"v", 1}, {"d", 1}}.dump(), kNull),
                "22023", "\"k\" must equal the key");
  CHECK_REFUSED(
      attempt(url, kEnqueue, "inventory", key, json{{"v", 1}, {"k", "W1"}, {"d", 1}}.dump(), kNull),
      "22023", "\"k\" must equal the key");

  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].envelope == json{{"v", 1}, {"k", key}, {"d", {{"n", 1}}}});
  CHECK(rows[1].envelope == json{{"v", 1}, {"k", key}, {"access", true}});
}

TEST_CASE("app id: [a-z0-9][a-z0-9-]{0,62} accepted, anything else refused", "[sql][rules]") {
  const auto url = fresh_database();
  const std::string longest = "a" + repeat("-b", 31);  // 63 characters
  REQUIRE(longest.size() == 63);
  const std::vector<std::string> valid = {"inventory", "a", "0", "9lives", "a-", "a-b", longest};
  const std::vector<std::string> invalid = {
      "Inventory", "inventorY", "-x", "", longest + "c", "a_b", "a b", "a.b", "\xc3\xa9t\xc3\xa9"};
  REQUIRE((longest + "c").size() == 64);

  for (const auto& app : valid) {
    INFO("app id \"" << app << "\"");
    CHECK_NOTHROW(run(url, kEnqueue, app, "e-" + app, envelope("e-" + app), kNull));
    CHECK_NOTHROW(run(url, kPublish, app, "p-" + app, R"({"n":1})", false, kNull));
    CHECK_NOTHROW(run(url, "SELECT events.wake($1::text)", app));
  }
  for (const auto& app : invalid) {
    INFO("app id \"" << app << "\"");
    CHECK_REFUSED(attempt(url, kEnqueue, app, "w1", envelope("w1"), kNull), "22023", "app id");
    CHECK_REFUSED(attempt(url, kPublish, app, "w1", R"({"n":1})", false, kNull), "22023", "app id");
    CHECK_REFUSED(attempt(url, kPublish, app, "w1", kNull, true, kNull), "22023", "app id");
    CHECK_REFUSED(attempt(url, "SELECT events.wake($1::text)", app), "22023", "app id");
  }
  CHECK_REFUSED(attempt(url, kEnqueue, kNull, "w1", envelope("w1"), kNull), "22023", "app id");
  CHECK_REFUSED(attempt(url, kPublish, kNull, "w1", R"({"n":1})", false, kNull), "22023", "app id");
  CHECK_REFUSED(attempt(url, "SELECT events.wake($1::text)", kNull), "22023", "app id");

  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 2 * valid.size());
  for (size_t i = 0; i < valid.size(); ++i) {
    CHECK(rows[2 * i].app_id == valid[i]);
    CHECK(rows[2 * i].key == "e-" + valid[i]);
    CHECK(rows[2 * i + 1].app_id == valid[i]);
    CHECK(rows[2 * i + 1].key == "p-" + valid[i]);
  }
}

TEST_CASE("oversized data: 32768 bytes of JSON text stored as given, 32769 bytes become a resync",
          "[sql][rules]") {
  const auto url = fresh_database();
  // A JSON string of N characters has N + 2 bytes of text (the quotes).
  const json fits = repeat("x", 32766);
  const json over = repeat("x", 32767);
  // The limit is in bytes: 16383 two-byte characters + quotes = 32768 bytes (16385 characters);
  // one more ASCII character is 32769 bytes but only 16386 characters.
  const json fits_utf8 = repeat("\xc3\xa9", 16383);
  const json over_utf8 = repeat("\xc3\xa9", 16383) + "x";
  auto resync = [](const std::string& key) {
    return json{{"v", 1}, {"k", key}, {"resync", "oversized"}};
  };

  {
    // all in one transaction: an oversized value is not an error, the transaction commits
    pqxx::connection c(url);
    pqxx::work tx(c);
    tx.exec_params(kEnqueue, "inventory", "e-fits", envelope("e-fits", fits), kNull);
    tx.exec_params(kEnqueue, "inventory", "e-over", envelope("e-over", over), kNull);
    tx.exec_params(kEnqueue, "inventory", "e-fits-utf8", envelope("e-fits-utf8", fits_utf8), kNull);
    tx.exec_params(kEnqueue, "inventory", "e-over-utf8", envelope("e-over-utf8", over_utf8), kNull);
    tx.exec_params(kPublish, "inventory", "p-fits", fits.dump(), false, kNull);
    tx.exec_params(kPublish, "inventory", "p-over", over.dump(), false, kNull);
    tx.exec_params(kPublish, "inventory", "p-over-utf8", over_utf8.dump(), false, kNull);
    tx.commit();
  }

  {
    // the boundary cases really are 32768 / 32769 bytes of jsonb text
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    CHECK(tx.exec_params("SELECT octet_length(($1::jsonb)::text)", fits.dump())[0][0].as<int>() ==
          32768);
    CHECK(tx.exec_params("SELECT octet_length(($1::jsonb)::text)", over.dump())[0][0].as<int>() ==
          32769);
    CHECK(tx.exec_params("SELECT octet_length(($1::jsonb)::text)", fits_utf8.dump())[0][0]
              .as<int>() == 32768);
    CHECK(tx.exec_params("SELECT octet_length(($1::jsonb)::text)", over_utf8.dump())[0][0]
              .as<int>() == 32769);
    CHECK(tx.exec_params("SELECT length(($1::jsonb)::text)", over_utf8.dump())[0][0].as<int>() ==
          16386);
  }

  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 7);
  CHECK(rows[0].key == "e-fits");
  CHECK(rows[0].envelope == json{{"v", 1}, {"k", "e-fits"}, {"d", fits}});
  CHECK(rows[1].key == "e-over");
  CHECK(rows[1].envelope == resync("e-over"));
  CHECK(rows[2].key == "e-fits-utf8");
  CHECK(rows[2].envelope == json{{"v", 1}, {"k", "e-fits-utf8"}, {"d", fits_utf8}});
  CHECK(rows[3].key == "e-over-utf8");
  CHECK(rows[3].envelope == resync("e-over-utf8"));
  CHECK(rows[4].key == "p-fits");
  CHECK(rows[4].envelope == json{{"v", 1}, {"k", "p-fits"}, {"d", fits}});
  CHECK(rows[5].key == "p-over");
  CHECK(rows[5].envelope == resync("p-over"));
  CHECK(rows[6].key == "p-over-utf8");
  CHECK(rows[6].envelope == resync("p-over-utf8"));
  for (const auto& row : rows) CHECK(row.app_id == "inventory");
}

TEST_CASE(
    "same coalesce key, same app, same transaction: one update at the first position with the last "
    "data",
    "[sql][rules][coalesce]") {
  const auto url = fresh_database();

  SECTION("events.publish_live") {
    pqxx::connection c(url);
    pqxx::work tx(c);
    tx.exec_params(kPublish, "inventory", "w1", R"({"n":1})", false, "stock:w1");
    tx.exec_params(kPublish, "inventory", "w2", R"({"other":true})", false, kNull);  // in between
    tx.exec_params(kPublish, "inventory", "w1", R"({"n":2})", false, "stock:w1");
    tx.exec_params(kPublish, "inventory", "w1", R"({"n":3})", false, "stock:w1");
    tx.commit();
  }
  SECTION("events.enqueue returns the position of the first") {
    pqxx::connection c(url);
    pqxx::work tx(c);
    const auto first =
        tx.exec_params(kEnqueue, "inventory", "w1", envelope("w1", {{"n", 1}}), "stock:w1")[0][0]
            .as<long long>();
    const auto between =
        tx.exec_params(kEnqueue, "inventory", "w2", envelope("w2", {{"other", true}}), kNull)[0][0]
            .as<long long>();
    const auto second =
        tx.exec_params(kEnqueue, "inventory", "w1", envelope("w1", {{"n", 2}}), "stock:w1")[0][0]
            .as<long long>();
    const auto third =
        tx.exec_params(kEnqueue, "inventory", "w1", envelope("w1", {{"n", 3}}), "stock:w1")[0][0]
            .as<long long>();
    tx.commit();
    CHECK(first < between);
    CHECK(second == first);
    CHECK(third == first);
  }

  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].key == "w1");
  CHECK(rows[0].coalesce_key == std::optional<std::string>("stock:w1"));
  CHECK(rows[0].envelope == json{{"v", 1}, {"k", "w1"}, {"d", {{"n", 3}}}});
  CHECK(rows[1].key == "w2");
  CHECK(rows[1].envelope == json{{"v", 1}, {"k", "w2"}, {"d", {{"other", true}}}});
  CHECK(rows[0].position < rows[1].position);
}

TEST_CASE("same coalesce key in two transactions: two updates", "[sql][rules][coalesce]") {
  const auto url = fresh_database();
  run(url, kPublish, "inventory", "w1", R"({"n":1})", false, "stock:w1");
  run(url, kEnqueue, "inventory", "w1", envelope("w1", {{"n", 2}}), "stock:w1");
  run(url, kPublish, "inventory", "w1", R"({"n":3})", false, "stock:w1");

  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(rows[i].envelope == json{{"v", 1}, {"k", "w1"}, {"d", {{"n", i + 1}}}});
    CHECK(rows[i].coalesce_key == std::optional<std::string>("stock:w1"));
  }
}

TEST_CASE("null coalesce key: every call writes its own update", "[sql][rules][coalesce]") {
  const auto url = fresh_database();
  {
    pqxx::connection c(url);
    pqxx::work tx(c);
    tx.exec_params(kPublish, "inventory", "w1", R"({"n":1})", false, kNull);
    tx.exec_params(kPublish, "inventory", "w1", R"({"n":1})", false, kNull);
    tx.exec_params(kEnqueue, "inventory", "w1", envelope("w1", {{"n", 1}}), kNull);
    tx.exec_params(kEnqueue, "inventory", "w1", envelope("w1", {{"n", 1}}), kNull);
    tx.commit();
  }
  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 4);
  for (const auto& row : rows) {
    CHECK(row.key == "w1");
    CHECK_FALSE(row.coalesce_key.has_value());
  }
}

TEST_CASE("same coalesce key, different apps: one update per app", "[sql][rules][coalesce]") {
  const auto url = fresh_database();
  {
    pqxx::connection c(url);
    pqxx::work tx(c);
    tx.exec_params(kPublish, "inventory", "w1", R"({"n":1})", false, "c");
    tx.exec_params(kPublish, "orders", "w1", R"({"n":2})", false, "c");
    tx.exec_params(kPublish, "inventory", "w1", R"({"n":3})", false, "c");
    tx.exec_params(kPublish, "orders", "w1", R"({"n":4})", false, "c");
    tx.commit();
  }
  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].app_id == "inventory");
  CHECK(rows[0].envelope["d"] == json{{"n", 3}});
  CHECK(rows[1].app_id == "orders");
  CHECK(rows[1].envelope["d"] == json{{"n", 4}});
}

TEST_CASE(
    "an update is written with the caller's transaction: nothing on rollback, the row on commit",
    "[sql][rules]") {
  const auto url = fresh_database();

  {
    pqxx::connection c(url);
    pqxx::work tx(c);
    tx.exec_params(kPublish, "inventory", "w1", R"({"n":1})", false, kNull);
    tx.exec_params(kEnqueue, "inventory", "w2", envelope("w2"), kNull);
    CHECK(tx.exec("SELECT count(*) FROM events.outbox")[0][0].as<int>() == 2);  // seen inside
    tx.abort();
  }
  CHECK(outbox_count(url) == 0);

  pqxx::connection c(url);
  pqxx::connection observer(url);
  pqxx::nontransaction clock(observer);
  const auto before = clock.exec("SELECT clock_timestamp()::text")[0][0].as<std::string>();
  std::string id;
  {
    pqxx::work tx(c);
    id = tx.exec("SELECT gen_random_uuid()::text")[0][0].as<std::string>();
    tx.exec_params("SELECT events.enqueue($1::uuid, 'inventory', 'live', 'w1', $2::jsonb, 'c1')",
                   id, envelope("w1", {{"n", 7}}));
    CHECK(outbox_count(url) == 0);  // not visible to others before commit
    tx.commit();
  }
  const auto after = clock.exec("SELECT clock_timestamp()::text")[0][0].as<std::string>();

  const auto r = clock.exec_params(
      "SELECT position, id::text, app_id, topic, key, envelope::text, coalesce_key,"
      " created_at BETWEEN $1::timestamptz AND $2::timestamptz"
      " FROM events.outbox",
      before, after);
  REQUIRE(r.size() == 1);
  CHECK(r[0][0].as<long long>() > 0);
  CHECK(r[0][1].as<std::string>() == id);
  CHECK(r[0][2].as<std::string>() == "inventory");
  CHECK(r[0][3].as<std::string>() == "live");
  CHECK(r[0][4].as<std::string>() == "w1");
  CHECK(json::parse(r[0][5].as<std::string>()) == json{{"v", 1}, {"k", "w1"}, {"d", {{"n", 7}}}});
  CHECK(r[0][6].as<std::string>() == "c1");
  CHECK(r[0][7].as<bool>());

  // the operator-facing columns and their types (SPEC 2.1)
  const auto columns = clock.exec(
      "SELECT column_name, data_type FROM information_schema.columns"
      " WHERE table_schema = 'events' AND table_name = 'outbox'");
  std::map<std::string, std::string> types;
  for (const auto& col : columns) types[col[0].as<std::string>()] = col[1].as<std::string>();
  CHECK(types["position"] == "bigint");
  CHECK(types["id"] == "uuid");
  CHECK(types["app_id"] == "text");
  CHECK(types["topic"] == "text");
  CHECK(types["key"] == "text");
  CHECK(types["envelope"] == "jsonb");
  CHECK(types["coalesce_key"] == "text");
  CHECK(types["created_at"] == "timestamp with time zone");
}

TEST_CASE("publish_live with access writes the access update before the data update",
          "[sql][rules][access]") {
  const auto url = fresh_database();
  const json over = repeat("x", 32767);
  {
    pqxx::connection c(url);
    pqxx::work tx(c);
    tx.exec_params(kPublish, "inventory", "w1", R"({"n":1})", true, "c1");
    tx.exec_params(kPublish, "inventory", "w2", over.dump(), true, kNull);
    tx.exec_params(kPublish, "inventory", "w3", kNull, true, kNull);
    tx.exec(
        "SELECT events.publish_live('inventory', 'w4', NULL, access => true)");  // named argument
                                                                                 // form
    tx.commit();
  }
  const json access_w1 = {{"v", 1}, {"k", "w1"}, {"access", true}};
  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 6);
  // with data: access row first, then the data row
  CHECK(rows[0].key == "w1");
  CHECK(rows[0].envelope == access_w1);
  CHECK_FALSE(rows[0].coalesce_key.has_value());
  CHECK(rows[1].key == "w1");
  CHECK(rows[1].envelope == json{{"v", 1}, {"k", "w1"}, {"d", {{"n", 1}}}});
  CHECK(rows[1].coalesce_key == std::optional<std::string>("c1"));
  CHECK(rows[0].id != rows[1].id);
  // with oversized data: the access row survives, the data row becomes a resync
  CHECK(rows[2].envelope == json{{"v", 1}, {"k", "w2"}, {"access", true}});
  CHECK(rows[3].envelope == json{{"v", 1}, {"k", "w2"}, {"resync", "oversized"}});
  // without data: the access row only
  CHECK(rows[4].envelope == json{{"v", 1}, {"k", "w3"}, {"access", true}});
  CHECK(rows[5].envelope == json{{"v", 1}, {"k", "w4"}, {"access", true}});
  for (const auto& row : rows) CHECK(row.topic == "live");
}

TEST_CASE("publish_live with neither data nor access is an error", "[sql][rules][access]") {
  const auto url = fresh_database();
  CHECK_REFUSED(attempt(url, kPublish, "inventory", "w1", kNull, false, kNull), "22004",
                "nothing to publish");
  CHECK_REFUSED(attempt(url, kPublish, "inventory", "w1", kNull, kNull, kNull), "22004",
                "nothing to publish");
  CHECK_REFUSED(attempt(url, "SELECT events.publish_live('inventory', 'w1', NULL)"), "22004",
                "nothing to publish");
  CHECK(outbox_count(url) == 0);
}

TEST_CASE("events.wake notifies channel outlive_wake with the app id", "[sql][wake]") {
  const auto url = fresh_database();
  pqxx::connection listen_conn(url);
  WakeListener listener(listen_conn);  // LISTEN outlive_wake

  pqxx::connection c(url);
  {
    pqxx::nontransaction tx(c);
    tx.exec("SELECT events.wake('inventory')");
  }
  REQUIRE(await_payloads(listen_conn, listener, 1));
  CHECK(listener.payloads == std::vector<std::string>{"inventory"});

  // A wake in a rolled-back transaction is never delivered: the next notification is the later one.
  {
    pqxx::work tx(c);
    tx.exec("SELECT events.wake('rolled-back')");
    tx.abort();
  }
  {
    pqxx::work tx(c);
    tx.exec("SELECT events.publish_live('orders', 'w1', '{\"n\":1}')");
    tx.exec("SELECT events.wake('orders')");
    tx.commit();
  }
  REQUIRE(await_payloads(listen_conn, listener, 2));
  CHECK(listener.payloads == std::vector<std::string>{"inventory", "orders"});

  // invalid app ids are refused and notify nothing
  {
    pqxx::nontransaction tx(c);
    CHECK_THROWS_AS(tx.exec("SELECT events.wake('Inventory')"), pqxx::sql_error);
    CHECK_THROWS_AS(tx.exec("SELECT events.wake('')"), pqxx::sql_error);
    CHECK_THROWS_AS(tx.exec("SELECT events.wake(NULL)"), pqxx::sql_error);
    tx.exec("SELECT events.wake('last')");
  }
  REQUIRE(await_payloads(listen_conn, listener, 3));
  CHECK(listener.payloads == std::vector<std::string>{"inventory", "orders", "last"});
}
