// common/log.hpp and log_limiter.hpp: the levels OUTLIVE_LOG_LEVEL accepts, the line's RFC 3339
// time read back, and the per-message limit driven by a clock the test moves.
#include <catch2/catch.hpp>

#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/log_limiter.hpp"

using namespace outlive;
using namespace std::chrono_literals;
using log::Level;
using log::LineLimiter;
using SystemClock = std::chrono::system_clock;

namespace {

// The RFC 3339 text back to a time point; fails the test unless it is exactly
// YYYY-MM-DDTHH:MM:SS.mmmZ.
SystemClock::time_point parse_rfc3339(const std::string& text) {
  REQUIRE(text.size() == 24);
  std::tm tm{};
  int ms = -1;
  char z = 0;
  REQUIRE(std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &tm.tm_year, &tm.tm_mon,
                      &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms, &z) == 8);
  REQUIRE(z == 'Z');
  REQUIRE(text[4] == '-');
  REQUIRE(text[10] == 'T');
  REQUIRE(text[19] == '.');
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return SystemClock::from_time_t(timegm(&tm)) + std::chrono::milliseconds(ms);
}

}  // namespace

TEST_CASE("the four levels are accepted in lower case and nothing else is") {
  CHECK(log::parse_level("debug") == Level::debug);
  CHECK(log::parse_level("info") == Level::info);
  CHECK(log::parse_level("warn") == Level::warn);
  CHECK(log::parse_level("error") == Level::error);
  for (const char* wrong : {"WARN", "Info", "warning", "loud", " info", "info ", "err", "fatal",
                            "trace", "0", "debug,info"}) {
    INFO(wrong);
    CHECK_FALSE(log::parse_level(wrong).has_value());
  }
}

TEST_CASE("the configuration's log level holds unless OUTLIVE_LOG_LEVEL is set, which wins") {
  CHECK(log::configured_level(nullptr, "warn") == Level::warn);
  CHECK(log::configured_level("", "error") == Level::error);
  CHECK(log::configured_level(nullptr, "info") == Level::info);
  CHECK(log::configured_level("debug", "error") == Level::debug);
  CHECK_THROWS_AS(log::configured_level("WARN", "info"), Error);
}

TEST_CASE("OUTLIVE_LOG_LEVEL unset or empty is info and a wrong one is an error naming it") {
  CHECK(log::level_from_environment(nullptr) == Level::info);
  CHECK(log::level_from_environment("") == Level::info);
  CHECK(log::level_from_environment("error") == Level::error);
  for (const char* wrong : {"WARN", "loud"}) {
    INFO(wrong);
    try {
      log::level_from_environment(wrong);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::invalid_input);
      CHECK_THAT(e.what(), Catch::Contains("OUTLIVE_LOG_LEVEL") &&
                               Catch::Contains(std::string("\"") + wrong + "\"") &&
                               Catch::Contains("debug, info, warn or error"));
    }
  }
}

TEST_CASE("time is RFC 3339 in UTC with milliseconds and reads back to the same millisecond") {
  // 2026-12-04T11:25:03.123Z
  const auto known = SystemClock::from_time_t(1796383503) + 123ms;
  CHECK(log::format_time(known) == "2026-12-04T11:25:03.123Z");
  CHECK(log::format_time(SystemClock::from_time_t(0)) == "1970-01-01T00:00:00.000Z");
  // Milliseconds are truncated, never rounded up into the next second.
  CHECK(log::format_time(SystemClock::from_time_t(1796383503) + 999999us) ==
        "2026-12-04T11:25:03.999Z");
  // A leap day and the last millisecond of a year.
  CHECK(log::format_time(SystemClock::from_time_t(1709164800)) == "2024-02-29T00:00:00.000Z");
  CHECK(log::format_time(SystemClock::from_time_t(1798761599) + 999ms) ==
        "2026-12-31T23:59:59.999Z");
  const auto now = std::chrono::floor<std::chrono::milliseconds>(SystemClock::now());
  CHECK(parse_rfc3339(log::format_time(now)) == now);
}

TEST_CASE("a line is one JSON object with time, level, logger, msg and the fields") {
  const auto at = SystemClock::from_time_t(1796383503) + 7ms;
  const std::string line = log::format_line(Level::warn, "access check timed out",
                                            {{"app", "inventory"},
                                             {"peer", "10.0.0.7"},
                                             {"socket", 42},
                                             {"msg", "a field may not replace the message"}},
                                            at);
  REQUIRE(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);
  const auto doc = nlohmann::json::parse(line);
  CHECK(doc["time"] == "2026-12-04T11:25:03.007Z");
  CHECK(parse_rfc3339(doc["time"]) == at);
  CHECK(doc["level"] == "warn");
  CHECK(doc["logger"] == "events:live");
  CHECK(doc["msg"] == "access check timed out");
  CHECK(doc["app"] == "inventory");
  CHECK(doc["peer"] == "10.0.0.7");
  CHECK(doc["socket"] == 42);
  CHECK_FALSE(doc.contains("ts"));
  // The fixed fields lead, where a reader of the raw line looks first.
  CHECK(line.rfind("{\"time\":", 0) == 0);
  // Bytes that are not UTF-8 (a client's payload) do not break the line.
  CHECK_NOTHROW(nlohmann::json::parse(
      log::format_line(Level::info, "websocket protocol error", {{"error", "\xff\xfe"}}, at)));
}

TEST_CASE("the limiter writes a burst then the rate and reports what it refused a window later") {
  LineLimiter limiter(10, 10, 1000ms);
  const auto t0 = LineLimiter::Clock::time_point{} + 100s;
  int written = 0;
  for (int i = 0; i < 10; ++i) {
    written += limiter.admit("closed", Level::info, t0) == LineLimiter::Verdict::write;
  }
  CHECK(written == 10);
  // The 11th in the same instant is refused; the first refused one says a report is due.
  CHECK(limiter.admit("closed", Level::info, t0) == LineLimiter::Verdict::counted_first);
  CHECK(limiter.admit("closed", Level::info, t0) == LineLimiter::Verdict::counted);
  CHECK(limiter.next_due() == t0 + 1000ms);
  // Another message has a bucket of its own.
  CHECK(limiter.admit("timed out", Level::warn, t0) == LineLimiter::Verdict::write);
  // 100 ms later one token came back: one more line, then refused again.
  CHECK(limiter.admit("closed", Level::info, t0 + 100ms) == LineLimiter::Verdict::write);
  CHECK(limiter.admit("closed", Level::info, t0 + 100ms) == LineLimiter::Verdict::counted);
  // Nothing is reported before the window ends, then the count once.
  CHECK(limiter.take_due(t0 + 999ms).empty());
  const auto due = limiter.take_due(t0 + 1000ms);
  REQUIRE(due.size() == 1);
  CHECK(due[0].message == "closed");
  CHECK(due[0].level == Level::info);
  CHECK(due[0].count == 3);
  CHECK(limiter.take_due(t0 + 5s).empty());
  CHECK(limiter.next_due() == LineLimiter::Clock::time_point::max());
}

TEST_CASE("a steady flood writes the rate and counts every other line") {
  LineLimiter limiter(10, 10, 1000ms);
  const auto t0 = LineLimiter::Clock::time_point{} + 100s;
  // 1000 lines a second for 5 s: 10 at once, then 10 a second.
  uint64_t written = 0, reported = 0;
  for (int ms = 0; ms < 5000; ++ms) {
    const auto now = t0 + std::chrono::milliseconds(ms);
    written += limiter.admit("closed", Level::info, now) == LineLimiter::Verdict::write;
    for (const auto& s : limiter.take_due(now)) reported += s.count;
  }
  for (const auto& s : limiter.take_due(t0 + 10s)) reported += s.count;
  CHECK(written >= 10 + 49);
  CHECK(written <= 10 + 50);
  CHECK(written + reported == 5000);
}

TEST_CASE("below the limit every line is written and nothing is reported") {
  LineLimiter limiter(10, 10, 1000ms);
  const auto t0 = LineLimiter::Clock::time_point{} + 100s;
  // 10 a second, evenly: exactly the rate, never refused.
  for (int i = 0; i < 100; ++i) {
    INFO(i);
    CHECK(limiter.admit("closed", Level::info, t0 + std::chrono::milliseconds(100 * i)) ==
          LineLimiter::Verdict::write);
  }
  CHECK(limiter.next_due() == LineLimiter::Clock::time_point::max());
  CHECK(limiter.take_due(t0 + 1h).empty());
}
