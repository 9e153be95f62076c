// Migrations (sql/, embedded in the binary) and the missing-outbox check of SPEC 2.4, against a
// real PostgreSQL; concurrent runs through the real `outlive` binary.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "harness/process.hpp"
#include "outbox/migrate.hpp"
#include "support/services.hpp"

namespace {

using Catch::Matchers::Contains;
using outlive::Errc;
using outlive::testing::fresh_database;
using outlive::testing::outlive_binary;
using outlive::testing::source_path;

const char* const kMissingOutbox =
    "\"inventory\" writes live updates to events.outbox, which does not exist.";

// The migration files of the repository, in name order: what migrate() must apply.
std::vector<std::string> migration_files() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(source_path("sql"))) {
    if (entry.path().extension() == ".sql") names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// name -> number of rows in events.schema_migrations
std::map<std::string, int> recorded_migrations(const std::string& url) {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  std::map<std::string, int> out;
  for (const auto& r :
       tx.exec("SELECT name, count(*) FROM events.schema_migrations GROUP BY name")) {
    out[r[0].as<std::string>()] = r[1].as<int>();
  }
  return out;
}

bool outbox_exists(const std::string& url) {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  return tx.exec("SELECT to_regclass('events.outbox') IS NOT NULL")[0][0].as<bool>();
}

// Writes one update through events.enqueue and reads it back.
bool enqueue_works(const std::string& url) {
  pqxx::connection c(url);
  pqxx::work tx(c);
  tx.exec(
      "SELECT events.enqueue(gen_random_uuid(), 'inventory', 'live', 'w1',"
      " '{\"v\":1,\"k\":\"w1\",\"d\":{\"n\":1}}'::jsonb)");
  const bool written =
      tx.exec("SELECT count(*) FROM events.outbox WHERE app_id = 'inventory' AND key = 'w1'")[0][0]
          .as<int>() == 1;
  tx.abort();
  return written;
}

bool exited_with(const std::optional<int>& status, int code) {
  return status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == code;
}

}  // namespace

TEST_CASE("migrate applies the migrations once and records them", "[migrate]") {
  const auto url = fresh_database(false);
  const auto files = migration_files();
  REQUIRE(std::find(files.begin(), files.end(), "001_outbox.sql") != files.end());
  REQUIRE_FALSE(outbox_exists(url));

  const auto first = outlive::outbox::migrate(url);
  CHECK(first.applied == files);
  CHECK(first.skipped.empty());
  CHECK(outbox_exists(url));
  std::map<std::string, int> once;
  for (const auto& f : files) once[f] = 1;
  CHECK(recorded_migrations(url) == once);
  CHECK(enqueue_works(url));

  // Pending updates survive a second run, which applies nothing.
  {
    pqxx::connection c(url);
    pqxx::work tx(c);
    tx.exec("SELECT events.publish_live('inventory', 'kept', '{\"n\":1}')");
    tx.commit();
  }
  const auto second = outlive::outbox::migrate(url);
  CHECK(second.applied.empty());
  CHECK(second.skipped == files);
  CHECK(recorded_migrations(url) == once);
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  CHECK(tx.exec("SELECT count(*) FROM events.outbox WHERE key = 'kept'")[0][0].as<int>() == 1);
}

TEST_CASE("four concurrent `outlive migrate` runs all succeed and apply each migration once",
          "[migrate]") {
  const auto url = fresh_database(false);
  const auto files = migration_files();
  const std::string dir = outlive::harness::make_temp_dir("outlive-migrate-test-");

  std::vector<outlive::harness::ChildProcess> runs;
  std::vector<std::string> logs;
  for (int i = 0; i < 4; ++i) {
    logs.push_back(dir + "/migrate-" + std::to_string(i) + ".log");
    runs.emplace_back(std::vector<std::string>{outlive_binary(), "migrate", "--database", url},
                      logs.back());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int applied_by = 0;  // runs that report having applied the migrations
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const auto status = runs[i].wait_for(std::max(left, std::chrono::milliseconds(0)));
    const std::string log = outlive::harness::tail_of_file(logs[i]);
    INFO("run " << i << " log:\n" << log);
    REQUIRE(status.has_value());  // finished before the deadline
    CHECK(exited_with(status, 0));

    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);) {
      const auto doc = nlohmann::json::parse(line, nullptr, false);
      if (doc.is_object() && doc.value("msg", "") == "migrations" && doc.contains("applied") &&
          !doc["applied"].empty()) {
        CHECK(doc["applied"] == nlohmann::json(files));
        ++applied_by;
      }
    }
  }
  const char* level = std::getenv("OUTLIVE_LOG_LEVEL");
  if (level == nullptr || std::string(level) == "info" || std::string(level) == "debug") {
    CHECK(applied_by == 1);  // serialised: one run applied, the others found everything applied
  }

  std::map<std::string, int> once;
  for (const auto& f : files) once[f] = 1;
  CHECK(recorded_migrations(url) == once);
  CHECK(enqueue_works(url));
  outlive::harness::remove_tree(dir);
}

TEST_CASE("require_outbox names the app and the fix when events.outbox is missing", "[migrate]") {
  const auto url = fresh_database(false);
  pqxx::connection c(url);
  try {
    outlive::outbox::require_outbox(c, "inventory");
    FAIL("require_outbox did not throw on an unmigrated database");
  } catch (const outlive::Error& e) {
    CHECK(e.code() == Errc::not_migrated);
    CHECK_THAT(e.what(), Contains(kMissingOutbox) && Contains("outlive migrate"));
  }

  outlive::outbox::migrate(url);
  CHECK_NOTHROW(outlive::outbox::require_outbox(c, "inventory"));
}

TEST_CASE("`outlive serve` refuses to start on an unmigrated database, before contacting NATS",
          "[migrate]") {
  const auto url = fresh_database(false);
  // Nothing listens on port 1: had the replica got as far as NATS, it would fail differently.
  const auto config =
      outlive::testing::write_config(url, {"nats://127.0.0.1:1"}, "r1", {"inventory"});
  const std::string dir = outlive::harness::make_temp_dir("outlive-serve-test-");
  const std::string log_file = dir + "/serve.log";

  outlive::harness::ChildProcess serve({outlive_binary(), "serve", "--config", config}, log_file);
  const auto status = serve.wait_for(std::chrono::seconds(30));
  const std::string log = outlive::harness::tail_of_file(log_file);
  INFO("log:\n" << log);
  REQUIRE(status.has_value());
  CHECK(WIFEXITED(*status));
  CHECK_FALSE(exited_with(status, 0));
  // The log is JSON lines: the message is read back out of their fields.
  std::string said;
  std::stringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    const auto doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (doc.is_object()) said += doc.value("msg", "") + " " + doc.value("error", "") + "\n";
  }
  CHECK_THAT(said, Contains(kMissingOutbox) && Contains("outlive migrate"));
  CHECK_FALSE(outbox_exists(url));  // serve does not migrate
  outlive::harness::remove_tree(dir);
}
