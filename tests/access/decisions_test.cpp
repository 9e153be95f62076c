#include <catch2/catch.hpp>

#include "access/decisions.hpp"

using namespace outlive::access;
using namespace std::chrono_literals;

TEST_CASE("decisions are cached per key and viewer id, forgotten per key") {
  Decisions d(5min);
  const auto t = Decisions::Clock::now();
  d.put("k1", "user:ada", true, t);
  d.put("k1", "user:bob", false, t);
  d.put("k2", "user:ada", false, t);
  CHECK(d.get("k1", "user:ada", t) == true);
  CHECK(d.get("k1", "user:bob", t) == false);
  CHECK_FALSE(d.get("k1", "user:ada:read", t));  // another id (scopes) never inherits
  d.forget("k1");
  CHECK_FALSE(d.get("k1", "user:ada", t));
  CHECK(d.get("k2", "user:ada", t) == false);
}

TEST_CASE("decisions expire after their lifetime, on both sides of it") {
  Decisions d(5min);
  const auto t = Decisions::Clock::now();
  d.put("k", "v", true, t);
  CHECK(d.get("k", "v", t + 5min - 1ms) == true);
  CHECK_FALSE(d.get("k", "v", t + 5min));
  CHECK(d.missing("k", {"v", "w"}, t) == std::vector<std::string>{"w"});
}

TEST_CASE("authorize batches hold at most 500 viewers") {
  std::vector<int> viewers(1200);
  const auto b = batches(viewers, 500);
  REQUIRE(b.size() == 3);
  CHECK(b[0].size() == 500);
  CHECK(b[2].size() == 200);
  CHECK(batches(std::vector<int>(500), 500).size() == 1);
  CHECK(batches(std::vector<int>(501), 500).size() == 2);
  CHECK(batches(std::vector<int>{}, 500).empty());
}

TEST_CASE("an answer from before an access update is not cached") {
  Decisions d(5min);
  const auto t = Decisions::Clock::now();
  const auto g = d.generation("k");
  d.forget("k");  // an access update arrives while the check runs
  CHECK_FALSE(d.put_if_current("k", "v", true, t, g));
  CHECK_FALSE(d.get("k", "v", t));
  CHECK(d.put_if_current("k", "v", false, t, d.generation("k")));
  CHECK(d.get("k", "v", t) == false);
}
