// The typed queries and connections db/ hands to the folders that may not name libpqxx
// (issue 37): the access queries (SPEC 5.4, 5.5) and the background loops' kept connection, against
// a real PostgreSQL 15.
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <optional>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/socket_slot.hpp"
#include "db/access_queries.hpp"
#include "db/connection.hpp"
#include "db/kept_connection.hpp"
#include "support/services.hpp"

using namespace std::chrono_literals;
using outlive::SocketSlot;
using outlive::db::AccessQueries;
using outlive::db::Column;
using outlive::db::KeptConnection;

namespace {

// An empty database of the test binary's one PostgreSQL (tests/support): db/ has no migrations.
std::string fresh_database() { return outlive::testing::fresh_database(/*migrated=*/false); }

// keys(scope, viewer): the scope's "keys" in order, for a viewer with an id.
const char* const kKeysSql =
    "SELECT e FROM jsonb_array_elements_text($1->'keys') WITH ORDINALITY AS t(e, n) "
    "WHERE $2->>'id' IS NOT NULL ORDER BY n";
// authorize(key, viewers): the ids of the viewers, in order, for key "k" only.
const char* const kAuthorizeSql =
    "SELECT v->>'id' FROM jsonb_array_elements($2) WITH ORDINALITY AS t(v, n) "
    "WHERE $1 = 'k' ORDER BY n";

}  // namespace

TEST_CASE("AccessQueries hand back the first column in order, NULL as nullopt") {
  pqxx::connection raw(fresh_database());
  outlive::db::Connection conn(raw);

  CHECK(AccessQueries::keys(conn, kKeysSql, R"({"keys":["b",null,"a"]})", R"({"id":"v"})") ==
        Column{"b", std::nullopt, "a"});
  CHECK(AccessQueries::keys(conn, kKeysSql, R"({"keys":[]})", R"({"id":"v"})").empty());
  // The parameters are typed jsonb: $2->>'id' of a viewer without an id is NULL, so no row.
  CHECK(AccessQueries::keys(conn, kKeysSql, R"({"keys":["a"]})", R"({})").empty());

  CHECK(AccessQueries::authorize(conn, kAuthorizeSql, "k", R"([{"id":"x"},{"id":null}])") ==
        Column{"x", std::nullopt});
  CHECK(AccessQueries::authorize(conn, kAuthorizeSql, "other", R"([{"id":"x"}])").empty());
}

TEST_CASE("AccessQueries: a failing query throws with Postgres's message") {
  pqxx::connection raw(fresh_database());
  outlive::db::Connection conn(raw);
  try {
    (void)AccessQueries::authorize(conn, "SELECT id FROM no_such_table WHERE $1 = $2::text", "k",
                                   "[]");
    FAIL("no error");
  } catch (const std::exception& e) {
    CHECK_THAT(e.what(), Catch::Contains("no_such_table"));
  }
  // The connection goes on serving.
  CHECK(AccessQueries::keys(conn, kKeysSql, R"({"keys":["a"]})", R"({"id":"v"})").size() == 1);
}

TEST_CASE("AccessQueries: keys() of several scopes in one round trip, a column per scope") {
  pqxx::connection raw(fresh_database());
  outlive::db::Connection conn(raw);
  const std::vector<std::string> scopes{R"({"keys":["a","b"]})", R"({"keys":[]})",
                                        R"({"keys":[null,"c"]})"};
  CHECK(AccessQueries::keys(conn, kKeysSql, scopes, R"({"id":"v"})") ==
        std::vector<Column>{Column{"a", "b"}, Column{}, Column{std::nullopt, "c"}});
  CHECK(AccessQueries::keys(conn, kKeysSql, std::vector<std::string>{R"({"keys":["z"]})"},
                            R"({"id":"v"})") == std::vector<Column>{Column{"z"}});
  // One that fails fails the call, and the connection goes on serving.
  CHECK_THROWS_WITH(AccessQueries::keys(conn, kKeysSql,
                                        std::vector<std::string>{R"({"keys":["a"]})",
                                                                 R"({"keys":"not an array"})"},
                                        R"({"id":"v"})"),
                    Catch::Contains("cannot extract elements"));
  CHECK(AccessQueries::keys(conn, kKeysSql, scopes, R"({"id":"v"})").size() == 3);
}

TEST_CASE("KeptConnection: named, with its statement timeout, reopened after drop()") {
  const auto url = fresh_database();
  SocketSlot slot;
  KeptConnection kept(url, 2s, "outlive-test-kept", 1500ms, slot);
  kept.ping();
  pqxx::nontransaction tx(kept.get().raw());
  CHECK(tx.exec("SHOW statement_timeout")[0][0].as<std::string>() == "1500ms");
  CHECK(tx.exec("SELECT current_setting('application_name')")[0][0].as<std::string>() ==
        "outlive-test-kept");
  const int pid = kept.get().raw().backendpid();
  tx.commit();

  kept.drop();
  kept.ping();
  CHECK(kept.get().raw().backendpid() != pid);

  // A statement past the timeout fails, and the caller's drop() lets the next get() reopen.
  CHECK_THROWS(pqxx::nontransaction(kept.get().raw()).exec("SELECT pg_sleep(3)"));
  kept.drop();
  CHECK_NOTHROW(kept.ping());
}

TEST_CASE("KeptConnection: interrupting its slot cuts short a query that does not answer") {
  const auto url = fresh_database();
  SocketSlot slot;
  KeptConnection kept(url, 2s, "outlive-test-kept", 60000ms, slot);
  kept.ping();
  auto blocked = std::async(std::launch::async, [&] {
    try {
      pqxx::nontransaction(kept.get().raw()).exec("SELECT pg_sleep(30)");
      return false;
    } catch (const std::exception&) {
      return true;
    }
  });
  // Given time to reach the server, then cut: the query returns long before its 30 s.
  REQUIRE(blocked.wait_for(300ms) == std::future_status::timeout);
  const auto cut = std::chrono::steady_clock::now();
  slot.interrupt();
  REQUIRE(blocked.wait_for(5s) == std::future_status::ready);
  CHECK(blocked.get());
  CHECK(std::chrono::steady_clock::now() - cut < 5s);
}

TEST_CASE("KeptConnection: a server that is not there fails get() within the connect timeout") {
  SocketSlot slot;
  KeptConnection kept("postgresql://postgres@127.0.0.1:1/postgres", 2s, "outlive-test-kept", 1000ms,
                      slot);
  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS(kept.ping());
  CHECK(std::chrono::steady_clock::now() - started < 5s);
}
