// SPEC 2.5 (rev 3): apps isolated in the shared outbox. Roles are set up by running the SQL block
// of docs/WRITERS.md as it is, then log in as themselves on a real PostgreSQL; and the 256 KiB
// envelope limit on both sides.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "harness/embedded_nats.hpp"
#include "harness/process.hpp"
#include "outbox/live.hpp"
#include "outbox/migrate.hpp"
#include "support/services.hpp"

namespace {

using Catch::Matchers::Contains;
using nlohmann::json;
using outlive::testing::fresh_database;
using outlive::testing::source_path;

const char* const kNull = nullptr;  // a NULL parameter
const std::string kEnqueue =
    "SELECT events.enqueue(gen_random_uuid(), $1::text, 'live', $2::text, $3::jsonb, $4::text)";
const std::string kPublish =
    "SELECT events.publish_live($1::text, $2::text, $3::jsonb, $4::boolean, $5::text)";
const std::string kWake = "SELECT events.wake($1::text)";

// Roles belong to the whole cluster, which every test of a process shares.
std::string unique_role(const std::string& base) {
  static std::atomic<int> counter{0};
  return base + "_" + std::to_string(getpid()) + "_" + std::to_string(++counter);
}

// The same database, logged in as `role` (the harness's server trusts every role on 127.0.0.1).
std::string as_role(const std::string& url, const std::string& role) {
  const std::string scheme = "postgresql://";
  const auto at = url.find('@');
  REQUIRE((url.rfind(scheme, 0) == 0 && at != std::string::npos));
  return scheme + role + url.substr(at);
}

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}

// The SQL block docs/WRITERS.md gives to set a writer up, as written there.
std::string documented_setup() {
  std::ifstream in(source_path("docs/WRITERS.md"));
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const auto marker = doc.find("<!-- writer-setup");
  REQUIRE(marker != std::string::npos);
  const auto open = doc.find("```sql\n", marker);
  REQUIRE(open != std::string::npos);
  const auto body = open + 7;
  const auto close = doc.find("```", body);
  REQUIRE(close != std::string::npos);
  return doc.substr(body, close - body);
}

// Runs the documented setup as the superuser with `role` in place of the docs' inventory_writer
// and `app` in place of 'inventory'.
std::string setup_writer_as_documented(const std::string& url, const std::string& app) {
  std::string sql = documented_setup();
  REQUIRE_THAT(sql, Contains("inventory_writer") && Contains("'inventory'"));
  const std::string role = unique_role(app + "_writer");
  replace_all(sql, "inventory_writer", role);
  replace_all(sql, "'inventory'", "'" + app + "'");
  pqxx::connection c(url);
  pqxx::work tx(c);
  tx.exec(sql);
  tx.commit();
  return role;
}

long long outbox_count(const std::string& url) {
  pqxx::connection c(url);
  return pqxx::nontransaction(c).exec("SELECT count(*) FROM events.outbox")[0][0].as<long long>();
}

// (app, key, envelope) of every pending row, read by the superuser.
std::vector<std::tuple<std::string, std::string, json>> outbox_rows(const std::string& url) {
  pqxx::connection c(url);
  std::vector<std::tuple<std::string, std::string, json>> rows;
  for (const auto& r : pqxx::nontransaction(c).exec(
           "SELECT app_id, key, envelope::text FROM events.outbox ORDER BY position")) {
    rows.emplace_back(r[0].as<std::string>(), r[1].as<std::string>(),
                      json::parse(r[2].as<std::string>()));
  }
  return rows;
}

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

// As `login`, in one transaction: `first` (when not empty), then `statement`, expected to fail;
// then a commit attempt. `admin` (the superuser's URL) counts the outbox before and after.
template <typename... Args>
Refusal attempt(const std::string& admin, const std::string& login, const std::string& first,
                const std::string& statement, const Args&... args) {
  const long long before = outbox_count(admin);
  Refusal out;
  {
    pqxx::connection c(login);
    pqxx::work tx(c);
    if (!first.empty()) tx.exec(first);
    try {
      tx.exec_params(statement, args...);
    } catch (const pqxx::insufficient_privilege& e) {
      // libpqxx 6 throws this one without its SQLSTATE; it throws it for 42501 only.
      out.refused = true;
      out.sqlstate = e.sqlstate().empty() ? "42501" : e.sqlstate();
      out.message = e.what();
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
  out.outbox_unchanged = outbox_count(admin) == before;
  return out;
}

#define CHECK_REFUSED(outcome, sqlstate_expected, message_part) \
  do {                                                          \
    const Refusal r_ = (outcome);                               \
    INFO("error: " << r_.message);                              \
    CHECK(r_.refused);                                          \
    CHECK(r_.sqlstate == (sqlstate_expected));                  \
    CHECK_THAT(r_.message, Contains(message_part));             \
    CHECK(r_.outbox_unchanged);                                 \
  } while (0)

// A valid write of the writer's own app, done first in the transaction a refusal must roll back.
const std::string kOwnWrite = "SELECT events.publish_live('inventory', 'own', '{\"n\":0}')";

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

// {"v":1,"k":key,"x":"aaa..."} whose stored JSON text (jsonb's form) is exactly `bytes` long.
std::string envelope_of_size(const std::string& url, const std::string& key, size_t bytes) {
  pqxx::connection c(url);
  const auto base =
      pqxx::nontransaction(c)
          .exec_params(
              "SELECT octet_length(jsonb_build_object('v', 1, 'k', $1::text, 'x', '')::text)",
              key)[0][0]
          .as<size_t>();
  return json{{"v", 1}, {"k", key}, {"x", std::string(bytes - base, 'a')}}.dump();
}

}  // namespace

TEST_CASE(
    "a role set up as docs/WRITERS.md says writes its own app with enqueue, publish_live and wake",
    "[writers]") {
  const auto url = fresh_database();
  const auto role = setup_writer_as_documented(url, "inventory");
  const auto login = as_role(url, role);
  pqxx::connection listen_conn(url);
  WakeListener listener(listen_conn);

  run(login, kEnqueue, "inventory", "w1", json{{"v", 1}, {"k", "w1"}, {"d", {{"n", 1}}}}.dump(),
      kNull);
  run(login, kPublish, "inventory", "w2", R"({"n":2})", true, kNull);
  {
    pqxx::connection c(login);
    pqxx::nontransaction(c).exec_params(kWake, "inventory");
  }

  REQUIRE(await_payloads(listen_conn, listener, 1));
  CHECK(listener.payloads == std::vector<std::string>{"inventory"});
  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0] == std::make_tuple(std::string("inventory"), std::string("w1"),
                                   json{{"v", 1}, {"k", "w1"}, {"d", {{"n", 1}}}}));
  CHECK(rows[1] == std::make_tuple(std::string("inventory"), std::string("w2"),
                                   json{{"v", 1}, {"k", "w2"}, {"access", true}}));
  CHECK(rows[2] == std::make_tuple(std::string("inventory"), std::string("w2"),
                                   json{{"v", 1}, {"k", "w2"}, {"d", {{"n", 2}}}}));

  pqxx::connection c(url);
  const auto grant =
      pqxx::nontransaction(c).exec("SELECT app_id, role::text, granted_by FROM events.writers");
  REQUIRE(grant.size() == 1);
  CHECK(grant[0][0].as<std::string>() == "inventory");
  CHECK(grant[0][1].as<std::string>() == role);
  CHECK(grant[0][2].as<std::string>() == "postgres");
  // Granting again keeps the one grant.
  run(url, "SELECT events.grant_writer($1, 'inventory')", role);
  CHECK(pqxx::nontransaction(c).exec("SELECT count(*) FROM events.writers")[0][0].as<int>() == 1);
  run(login, kPublish, "inventory", "w3", R"({"n":3})", false, kNull);
}

TEST_CASE(
    "a writer's calls for another app fail with 42501 naming the app and role, writing nothing",
    "[writers]") {
  const auto url = fresh_database();
  const auto role = setup_writer_as_documented(url, "inventory");
  const auto login = as_role(url, role);
  const auto billing_role = setup_writer_as_documented(url, "billing");
  const auto billing = as_role(url, billing_role);

  const auto envelope = json{{"v", 1}, {"k", "w1"}, {"d", 1}}.dump();
  for (const auto& who : {std::make_pair(login, "billing"), std::make_pair(billing, "inventory")}) {
    const std::string& conn = who.first;
    const std::string app = who.second;
    const std::string first = conn == login ? kOwnWrite : std::string();
    const std::string name = conn == login ? role : billing_role;
    INFO("role " << name << " writing app " << app);
    CHECK_REFUSED(
        attempt(url, conn, first, kEnqueue, app, "w1", envelope, kNull), "42501",
        "events.enqueue: role " + name + " may not write the live updates of app '" + app + "'");
    CHECK_REFUSED(attempt(url, conn, first, kPublish, app, "w1", R"({"n":1})", false, kNull),
                  "42501", "events.publish_live: role " + name);
    CHECK_REFUSED(attempt(url, conn, first, kPublish, app, "w1", kNull, true, kNull), "42501",
                  "app '" + app + "'");
    CHECK_REFUSED(
        attempt(url, conn, first, kWake, app), "42501",
        "events.wake: role " + name + " may not write the live updates of app '" + app + "'");
  }
  CHECK(outbox_count(url) == 0);

  // The refused wake notified nothing: notifications arrive in commit order, so the first one
  // is the allowed wake made after it.
  pqxx::connection listen_conn(url);
  WakeListener listener(listen_conn);
  {
    pqxx::connection c(login);
    pqxx::nontransaction tx(c);
    CHECK_THROWS_AS(tx.exec_params(kWake, "billing"), pqxx::insufficient_privilege);
    tx.exec_params(kWake, "inventory");
  }
  REQUIRE(await_payloads(listen_conn, listener, 1));
  CHECK(listener.payloads == std::vector<std::string>{"inventory"});

  // Each writes its own app.
  run(login, kPublish, "inventory", "w1", R"({"n":1})", false, kNull);
  run(billing, kPublish, "billing", "w1", R"({"n":2})", false, kNull);
  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 2);
  CHECK(std::get<0>(rows[0]) == "inventory");
  CHECK(std::get<0>(rows[1]) == "billing");
}

TEST_CASE("a writer disconnects its own app's viewers only: 64 rows, one per partition (SPEC 2.6)",
          "[writers]") {
  const auto url = fresh_database();
  const auto role = setup_writer_as_documented(url, "inventory");
  const auto login = as_role(url, role);
  const std::string kDisconnect = "SELECT events.disconnect($1::text, $2::text)";
  CHECK_REFUSED(attempt(url, login, kOwnWrite, kDisconnect, "billing", "user:ada"), "42501",
                "events.disconnect: role " + role +
                    " may not write the live updates of app 'billing'");
  // Bad input: a clear error, nothing written.
  CHECK_REFUSED(attempt(url, login, "", kDisconnect, "inventory", ""), "22023",
                "viewer must have 1 to 600 characters");
  CHECK_REFUSED(attempt(url, login, "", kDisconnect, "inventory", std::string(601, 'v')), "22023",
                "viewer must have 1 to 600 characters (got 601)");
  CHECK_REFUSED(attempt(url, login, "",
                        "SELECT events.disconnect('inventory', 'user:ada', $1::text)",
                        std::string(201, 'r')),
                "22023", "reason must have 1 to 200 characters (got 201)");
  CHECK(outbox_count(url) == 0);

  run(login, kDisconnect, "inventory", std::string(600, 'v'));
  run(login, "SELECT events.disconnect('inventory', 'user:ada', $1::text)", std::string(200, 'r'));
  pqxx::connection c(url);
  const auto r = pqxx::nontransaction(c).exec(
      "SELECT count(*), count(DISTINCT partition), count(DISTINCT envelope->'disconnect'->>'id')"
      "  FROM events.outbox WHERE app_id = 'inventory' AND envelope ? 'disconnect'");
  CHECK(r[0][0].as<int>() == 128);
  CHECK(r[0][1].as<int>() == 64);
  CHECK(r[0][2].as<int>() == 2);
  CHECK(pqxx::nontransaction(c)
            .exec("SELECT count(*) FROM events.disconnects WHERE app_id = 'inventory'")[0][0]
            .as<int>() == 2);
}

TEST_CASE("a writer cannot read or change events.outbox, its sequence or the grants directly",
          "[writers]") {
  const auto url = fresh_database();
  const auto role = setup_writer_as_documented(url, "inventory");
  const auto login = as_role(url, role);
  run(url, kPublish, "billing", "b1", R"({"n":1})", false, kNull);  // another app's pending row
  run(url, kPublish, "inventory", "i1", R"({"n":1})", false, kNull);

  const std::string insert_own =
      "INSERT INTO events.outbox (id, app_id, topic, key, envelope)"
      " VALUES (gen_random_uuid(), 'inventory', 'live', 'w1', '{\"v\":1,\"k\":\"w1\",\"d\":1}')";
  const std::string insert_other =
      "INSERT INTO events.outbox (id, app_id, topic, key, envelope)"
      " VALUES (gen_random_uuid(), 'billing', 'live', 'w1', '{\"v\":1,\"k\":\"w1\",\"d\":1}')";
  for (const std::string& statement :
       {insert_own, insert_other,
        std::string("UPDATE events.outbox SET envelope = '{\"v\":1,\"k\":\"b1\",\"d\":0}'"),
        std::string("DELETE FROM events.outbox"), std::string("TRUNCATE events.outbox"),
        std::string("SELECT * FROM events.outbox"),
        std::string("SELECT count(*) FROM events.outbox WHERE app_id = 'inventory'"),
        std::string("SELECT nextval('events.outbox_position_seq')"),
        std::string("SELECT * FROM events.read_partitions('billing', 0, ARRAY(SELECT "
                    "generate_series(0, 63)::smallint), '{}', '{}', 100)"),
        std::string("SELECT * FROM events.read_horizon()"),
        std::string("SELECT * FROM events.writers"),
        "INSERT INTO events.writers (app_id, role) VALUES ('billing', '" + role + "')",
        "SELECT events.grant_writer('" + role + "', 'billing')",
        "SELECT events.revoke_writer('" + role + "', 'inventory')"}) {
    INFO(statement);
    CHECK_REFUSED(attempt(url, login, kOwnWrite, statement), "42501", "permission denied");
  }

  // Both pending rows are as they were, and the grant too.
  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0] == std::make_tuple(std::string("billing"), std::string("b1"),
                                   json{{"v", 1}, {"k", "b1"}, {"d", {{"n", 1}}}}));
  pqxx::connection c(url);
  CHECK(pqxx::nontransaction(c).exec("SELECT count(*) FROM events.writers")[0][0].as<int>() == 1);
}

TEST_CASE("grant_writer takes back the table rights an earlier setup gave a writer", "[writers]") {
  const auto url = fresh_database();
  const auto role = unique_role("legacy");
  // What a writer needed before SPEC 2.5 (issue 34): with these, it wrote any app's rows.
  run(url, "CREATE ROLE " + role + " LOGIN");
  run(url, "GRANT USAGE ON SCHEMA events TO " + role);
  run(url, "GRANT SELECT, INSERT ON events.outbox TO " + role);
  run(url, "GRANT USAGE ON SEQUENCE events.outbox_position_seq TO " + role);
  const auto login = as_role(url, role);
  const std::string insert_other =
      "INSERT INTO events.outbox (id, app_id, topic, key, envelope)"
      " VALUES (gen_random_uuid(), 'billing', 'live', 'w1', '{\"v\":1,\"k\":\"w1\",\"d\":1}')";
  run(login, insert_other);
  REQUIRE(outbox_count(url) == 1);

  run(url, "SELECT events.grant_writer('" + role + "', 'inventory')");
  CHECK_REFUSED(attempt(url, login, kOwnWrite, insert_other), "42501", "permission denied");
  CHECK_REFUSED(attempt(url, login, kOwnWrite, "SELECT count(*) FROM events.outbox"), "42501",
                "permission denied");
  CHECK_REFUSED(attempt(url, login, "", "SELECT events.publish_live('billing', 'w1', '1')"),
                "42501", "app 'billing'");
  run(login, kOwnWrite);
  CHECK(outbox_count(url) == 2);
}

TEST_CASE("revoke_writer takes the right away", "[writers]") {
  const auto url = fresh_database();
  const auto role = setup_writer_as_documented(url, "inventory");
  const auto login = as_role(url, role);
  run(url, "SELECT events.grant_writer('" + role + "', 'billing')");
  run(login, kPublish, "inventory", "w1", R"({"n":1})", false, kNull);
  run(login, kPublish, "billing", "w1", R"({"n":1})", false, kNull);
  REQUIRE(outbox_count(url) == 2);

  pqxx::connection admin(url);
  // The writer's session stays open across the revocation: the check is made at every call.
  pqxx::connection session(login);
  CHECK(pqxx::nontransaction(admin)
            .exec_params("SELECT events.revoke_writer($1, 'billing')", role)[0][0]
            .as<bool>());
  {
    pqxx::work tx(session);
    CHECK_THROWS_AS(tx.exec_params(kPublish, "billing", "w2", R"({"n":1})", false, kNull),
                    pqxx::insufficient_privilege);
  }
  CHECK_REFUSED(
      attempt(url, login, kOwnWrite, kPublish, "billing", "w2", R"({"n":1})", false, kNull),
      "42501", "app 'billing'");
  run(login, kPublish, "inventory", "w2", R"({"n":1})", false, kNull);  // still granted

  // The last app gone, the role cannot call the write functions at all.
  CHECK(pqxx::nontransaction(admin)
            .exec_params("SELECT events.revoke_writer($1, 'inventory')", role)[0][0]
            .as<bool>());
  CHECK_FALSE(pqxx::nontransaction(admin)
                  .exec_params("SELECT events.revoke_writer($1, 'inventory')", role)[0][0]
                  .as<bool>());
  const auto envelope = json{{"v", 1}, {"k", "w3"}, {"d", 1}}.dump();
  CHECK_REFUSED(attempt(url, login, "", kEnqueue, "inventory", "w3", envelope, kNull), "42501",
                "permission denied");
  CHECK_REFUSED(attempt(url, login, "", kPublish, "inventory", "w3", R"({"n":1})", false, kNull),
                "42501", "permission denied");
  CHECK_REFUSED(attempt(url, login, "", kWake, "inventory"), "42501", "permission denied");
  CHECK(outbox_count(url) == 3);
}

TEST_CASE("a grant to a group role covers the roles logged in as its members", "[writers]") {
  const auto url = fresh_database();
  const auto group = unique_role("inventory_writers");
  const auto member = unique_role("inventory_api");
  const auto outsider = unique_role("other_api");
  run(url, "CREATE ROLE " + group + " NOLOGIN");
  run(url, "SELECT events.grant_writer('" + group + "', 'inventory')");
  run(url, "CREATE ROLE " + member + " LOGIN IN ROLE " + group);
  run(url, "CREATE ROLE " + outsider + " LOGIN");
  run(url, "GRANT USAGE ON SCHEMA events TO " + outsider);
  run(url, "GRANT EXECUTE ON FUNCTION events.publish_live(text, text, jsonb, boolean, text) TO " +
               outsider);

  run(as_role(url, member), kOwnWrite);
  CHECK_REFUSED(
      attempt(url, as_role(url, member), kOwnWrite, kPublish, "billing", "w1", "1", false, kNull),
      "42501", "role " + member);
  // EXECUTE alone, granted by hand, is not a grant of the app.
  CHECK_REFUSED(attempt(url, as_role(url, outsider), "", kOwnWrite), "42501",
                "role " + outsider + " may not write the live updates of app 'inventory'");
  CHECK(outbox_count(url) == 1);
}

TEST_CASE("a non-superuser owner migrates, writes every app, and grants writers", "[writers]") {
  const auto url = fresh_database(false);
  const auto owner = unique_role("outlive_owner");
  const std::string dbname = pqxx::connection(url).dbname();
  run(url, "CREATE ROLE " + owner + " LOGIN");
  run(url, "GRANT CREATE ON DATABASE \"" + dbname + "\" TO " + owner);
  const auto as_owner = as_role(url, owner);
  outlive::outbox::migrate(as_owner);

  run(as_owner, kPublish, "inventory", "w1", R"({"n":1})", true, kNull);
  run(as_owner, kPublish, "billing", "w1", R"({"n":1})", false, kNull);
  run(as_owner, kWake, "billing");

  const auto writer = unique_role("inventory_writer");
  run(url, "CREATE ROLE " + writer + " LOGIN");
  run(as_owner, "SELECT events.grant_writer('" + writer + "', 'inventory')");
  run(as_role(url, writer), kOwnWrite);
  CHECK_REFUSED(
      attempt(url, as_role(url, writer), kOwnWrite, kPublish, "billing", "w1", "1", false, kNull),
      "42501", "app 'billing'");
  // The owner and superusers write every app already; a grant would only take their rights away.
  CHECK_REFUSED(attempt(url, as_owner, "", "SELECT events.grant_writer($1, 'inventory')", owner),
                "22023", "writes every app already");
  CHECK_REFUSED(attempt(url, url, "", "SELECT events.grant_writer('postgres', 'inventory')"),
                "22023", "writes every app already");
  CHECK(outbox_count(url) == 4);
}

TEST_CASE("LiveDefinition works for a role granted its app and throws for another app",
          "[writers][writer]") {
  const auto url = fresh_database();
  const auto role = setup_writer_as_documented(url, "inventory");
  const auto schema = source_path("schemas/inventory.event.json");
  const auto inventory = outlive::outbox::LiveDefinition::from_schema_file("inventory", schema);
  const auto billing = outlive::outbox::LiveDefinition::from_schema_file("billing", schema);
  const json data = {{"type", "item.changed"}, {"itemId", "i1"}, {"quantity", 3}};
  pqxx::connection listen_conn(url);
  WakeListener listener(listen_conn);

  pqxx::connection conn(as_role(url, role));
  {
    pqxx::work tx(conn);
    inventory.publish(tx, outlive::outbox::Update{"w1", data, std::nullopt});
    inventory.publish_access(tx, "w2", data);
    tx.commit();
  }
  inventory.wake(conn);
  REQUIRE(await_payloads(listen_conn, listener, 1));
  CHECK(outbox_count(url) == 3);

  const auto refused = [&](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      FAIL(what << " did not throw");
    } catch (const outlive::Error& e) {
      INFO(e.what());
      CHECK(e.code() == outlive::Errc::database);
      CHECK_THAT(e.what(),
                 Contains("[42501]") && Contains("role " + role) && Contains("app 'billing'"));
    }
  };
  refused(
      [&] {
        pqxx::work tx(conn);
        billing.publish(tx, outlive::outbox::Update{"w1", data, std::nullopt});
        tx.commit();
      },
      "publish");
  refused(
      [&] {
        pqxx::work tx(conn);
        billing.publish_access(tx, "w1");
        tx.commit();
      },
      "publish_access");
  refused([&] { billing.wake(conn); }, "wake");
  CHECK(outbox_count(url) == 3);
}

TEST_CASE("envelope: 262144 bytes of JSON text accepted, 262145 refused", "[writers][sql][rules]") {
  const auto url = fresh_database();
  const auto role = setup_writer_as_documented(url, "inventory");
  const auto login = as_role(url, role);

  for (const std::string& conn : {url, login}) {
    INFO((conn == url ? "as the superuser" : "as the writer"));
    const std::string at = envelope_of_size(url, "w1", 262144);
    const std::string over = envelope_of_size(url, "w1", 262145);
    const long long before = outbox_count(url);
    REQUIRE_NOTHROW(run(conn, kEnqueue, "inventory", "w1", at, kNull));
    CHECK(outbox_count(url) == before + 1);
    CHECK_REFUSED(attempt(url, conn, kOwnWrite, kEnqueue, "inventory", "w1", over, kNull), "22023",
                  "is 262145 bytes, more than the 262144 (256 KiB)");
  }
  pqxx::connection c(url);
  const auto sizes = pqxx::nontransaction(c).exec(
      "SELECT octet_length(envelope::text) FROM events.outbox ORDER BY position");
  REQUIRE(sizes.size() == 2);
  CHECK(sizes[0][0].as<long long>() == 262144);  // what the replicas publish is the limit itself
  CHECK(sizes[1][0].as<long long>() == 262144);

  // Counted on the whole envelope: a small `d` does not let the rest through.
  auto big = json::parse(envelope_of_size(url, "w2", 262145));
  big["d"] = {{"n", 1}};
  CHECK_REFUSED(attempt(url, login, kOwnWrite, kEnqueue, "inventory", "w2", big.dump(), kNull),
                "22023", "more than the 262144");
  // An oversized `d` still becomes a resync (SPEC 2.1), whatever the rest of the envelope held.
  auto resync = json::parse(envelope_of_size(url, "w3", 200000));
  resync["d"] = std::string(100000, 'd');
  run(login, kEnqueue, "inventory", "w3", resync.dump(), kNull);
  const auto rows = outbox_rows(url);
  REQUIRE(rows.size() == 3);
  CHECK(std::get<2>(rows[2]) == json{{"v", 1}, {"k", "w3"}, {"resync", "oversized"}});
}

TEST_CASE("an envelope of exactly 262144 bytes written by a writer is published by a replica",
          "[writers][publish]") {
  const auto url = fresh_database();
  const auto role = setup_writer_as_documented(url, "inventory");
  run(as_role(url, role), kEnqueue, "inventory", "w1", envelope_of_size(url, "w1", 262144), kNull);
  REQUIRE(outbox_count(url) == 1);

  outlive::harness::EmbeddedNats nats;
  const auto config = outlive::testing::write_config(url, {nats.url()}, "r1", {"inventory"});
  const std::string log = outlive::harness::make_temp_dir("outlive-writers-test-") + "/r1.log";
  outlive::harness::ChildProcess replica(
      {outlive::testing::outlive_binary(), "serve", "--config", config}, log);
  // A replica deletes a row once JetStream acknowledged it: the largest envelope the outbox takes
  // goes through the topic.
  const bool published = outlive::testing::eventually([&] { return outbox_count(url) == 0; },
                                                      std::chrono::seconds(30));
  INFO("replica log:\n" << outlive::harness::tail_of_file(log));
  CHECK(published);
}
