// Logs of the command line (SPEC 6; issue 35): OUTLIVE_LOG_LEVEL is checked at start (exit 2 on a
// level it does not know), it keeps lines below it out, and a fatal error at start is one JSON
// line and nothing else.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "cli/run.hpp"
#include "support/services.hpp"

using nlohmann::json;
using outlive::testing::run_outlive;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// The output is exactly one line, a log line of level error; it is returned.
json one_error_line(const std::string& output) {
  const auto lines = lines_of(output);
  REQUIRE(lines.size() == 1);
  const auto doc = json::parse(lines[0], nullptr, /*allow_exceptions=*/false);
  REQUIRE(doc.is_object());
  CHECK(doc.value("level", "") == "error");
  CHECK(doc.value("logger", "") == "events:live");
  CHECK(std::regex_match(doc.value("time", ""),
                         std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")));
  return doc;
}

}  // namespace

TEST_CASE("OUTLIVE_LOG_LEVEL=WARN or loud: serve and check exit 2 with one line naming it") {
  for (const std::string command : {"serve", "check"}) {
    for (const std::string level : {"WARN", "loud"}) {
      INFO(command << " " << level);
      const auto r = run_outlive({command, "--config", "/nonexistent/outlive.json"},
                                 {"OUTLIVE_LOG_LEVEL=" + level});
      INFO(r.output);
      CHECK(r.exit_code == 2);
      const auto doc = one_error_line(r.output);
      CHECK_THAT(doc.value("msg", ""), Catch::Contains("OUTLIVE_LOG_LEVEL") &&
                                           Catch::Contains("\"" + level + "\"") &&
                                           Catch::Contains("debug, info, warn or error"));
      CHECK(doc.value("command", "") == command);
    }
  }
}

TEST_CASE("a level in lower case is accepted: the command goes on to its own error") {
  for (const std::string level : {"debug", "info", "warn", "error", ""}) {
    INFO(level);
    const auto r = run_outlive({"check", "--config", "/nonexistent/outlive.json"},
                               {"OUTLIVE_LOG_LEVEL=" + level});
    INFO(r.output);
    CHECK(r.exit_code == 2);
    const auto doc = one_error_line(r.output);
    CHECK_THAT(doc.value("msg", ""), Catch::Contains("/nonexistent/outlive.json"));
    CHECK_THAT(doc.value("msg", ""), !Catch::Contains("OUTLIVE_LOG_LEVEL"));
  }
}

TEST_CASE("a fatal error at start is one JSON line and no plain-text copy") {
  const auto r = run_outlive({"serve", "--config", "/nonexistent/outlive.json"});
  INFO(r.output);
  CHECK(r.exit_code == 2);
  const auto doc = one_error_line(r.output);
  CHECK_THAT(doc.value("msg", ""), Catch::Contains("/nonexistent/outlive.json"));
  CHECK(doc.value("command", "") == "serve");
}

TEST_CASE("OUTLIVE_LOG_LEVEL=error keeps info lines out and debug or unset lets them through") {
  // `migrate` says what it applied at info.
  for (const std::string level : {"", "debug", "info"}) {
    INFO(level);
    const auto r = run_outlive({"migrate", "--database", outlive::testing::fresh_database(false)},
                               {"OUTLIVE_LOG_LEVEL=" + level});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    const auto lines = lines_of(r.output);
    REQUIRE(lines.size() == 1);
    const auto doc = json::parse(lines[0]);
    CHECK(doc["level"] == "info");
    CHECK(doc["msg"] == "migrations");
  }
  for (const std::string level : {"warn", "error"}) {
    INFO(level);
    const auto r = run_outlive({"migrate", "--database", outlive::testing::fresh_database(false)},
                               {"OUTLIVE_LOG_LEVEL=" + level});
    CHECK(r.exit_code == 0);
    CHECK(r.output.empty());
  }
}
