#include <catch2/catch.hpp>

#include "publisher/backoff.hpp"

using namespace std::chrono_literals;
using outlive::publisher::backoff_delay;

TEST_CASE("backoff starts at 1 s and doubles") {
  CHECK(backoff_delay(1) == 1s);
  CHECK(backoff_delay(2) == 2s);
  CHECK(backoff_delay(3) == 4s);
  CHECK(backoff_delay(9) == 256s);
}

TEST_CASE("backoff is capped at 5 minutes on both sides of the cap") {
  CHECK(backoff_delay(9) < 5min);
  CHECK(backoff_delay(10) == 5min);  // 512 s would pass the cap
  CHECK(backoff_delay(1000) == 5min);
}

TEST_CASE("no failure, no delay - custom base and cap") {
  CHECK(backoff_delay(0) == 0ms);
  CHECK(backoff_delay(3, 100ms, 250ms) == 250ms);
  CHECK(backoff_delay(2, 100ms, 250ms) == 200ms);
}
