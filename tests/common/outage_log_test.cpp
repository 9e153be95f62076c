// An outage logged as lines an operator can read (issue 47 item 9): lost, a repeat every 10 s with
// a count, back with the outage's length; driven by the test's own clock.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/outage_log.hpp"

using namespace outlive::log;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {
struct Line {
  Level level;
  std::string message;
  json fields;
};
}  // namespace

TEST_CASE("a 15 s outage failing 6 times a second writes 1 + 1 repeat + 1 back line") {
  std::vector<Line> lines;
  OutageLog outage("publisher: database", Level::error, 10s,
                   [&](Level l, std::string_view m, const json& f) { lines.push_back({l, std::string(m), f}); });
  const auto t0 = OutageLog::Clock::time_point{} + 1000s;
  outage.succeeded(t0);  // nothing to end
  CHECK(lines.empty());
  CHECK(!outage.failing());
  int failures = 0;
  for (auto t = t0; t < t0 + 15s; t += 166ms) {
    outage.failed("connection refused", {{"replica", "r1"}}, t);
    ++failures;
  }
  CHECK(outage.failing());
  outage.succeeded(t0 + 15s);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].level == Level::error);
  CHECK(lines[0].message == "publisher: database failed");
  CHECK(lines[0].fields == json{{"replica", "r1"}, {"error", "connection refused"}});
  CHECK(lines[1].message == "publisher: database still failing");
  CHECK(lines[1].fields["failing_for_s"].get<double>() >= 10.0);
  CHECK(lines[1].fields["failures"].get<int>() >= 59);  // the ones since the first line
  CHECK(lines[2].level == Level::info);
  CHECK(lines[2].message == "publisher: database works again");
  CHECK(lines[2].fields["outage_s"].get<double>() == Approx(15.0));
  CHECK(lines[2].fields["failures"].get<int>() == failures);
  CHECK(!outage.failing());
  // A second outage starts over with a first line.
  outage.failed("again", {}, t0 + 20s);
  REQUIRE(lines.size() == 4);
  CHECK(lines[3].message == "publisher: database failed");
}
