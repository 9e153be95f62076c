#include <atomic>
#include <catch2/catch.hpp>
#include <random>
#include <thread>

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

TEST_CASE("a key's stamp changes when a decision is added, changes value or is forgotten") {
  Decisions d(5min, 2);
  const auto t = Decisions::Clock::now();
  const auto empty = d.stamp("k");
  d.put("k", "ada", true, t);
  const auto one = d.stamp("k");
  CHECK(one != empty);
  Decisions::Clock::time_point expires{};
  CHECK(d.get("k", "ada", t + 1min, &expires) == true);
  CHECK(expires == t + 5min);
  CHECK(d.stamp("k") == one);  // a read changes nothing
  d.put("k", "ada", true, t + 1min);
  CHECK(d.stamp("k") == one);  // the same value again: only its expiry moved
  d.put("other", "ada", false, t);
  CHECK(d.stamp("k") == one);  // another key's decisions
  d.put("k", "ada", false, t + 1min);
  const auto changed = d.stamp("k");
  CHECK(changed != one);
  d.put("k", "bob", true, t + 1min);  // evicts "other" (max 2 entries); a new decision of k
  const auto added = d.stamp("k");
  CHECK(added != changed);
  d.forget("k");
  CHECK(d.stamp("k") != added);
  // Evicted and put again with the other value: the stamp moves, never back to an earlier one.
  Decisions small(5min, 1);
  small.put("k", "ada", true, t);
  const auto before = small.stamp("k");
  small.put("k2", "x", true, t);  // evicts k's only decision
  small.put("k", "ada", false, t);
  CHECK(small.stamp("k") != before);
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

TEST_CASE("past max_entries the least recently used decisions go first") {
  Decisions d(5min, 1000);
  const auto t = Decisions::Clock::now();
  auto key = [](int i) { return "k" + std::to_string(i % 7); };
  auto viewer = [](int i) { return "user:" + std::to_string(i); };
  for (int i = 0; i < 5000; ++i) {
    d.put(key(i), viewer(i), i % 3 == 0, t);
    if (i % 10 == 0) CHECK(d.get(key(0), viewer(0), t) == true);  // kept in use
    CHECK(d.size() <= 1000);
  }
  CHECK(d.size() == 1000);
  CHECK(d.get(key(0), viewer(0), t) == true);
  int kept = 0;
  for (int i = 4001; i < 5000; ++i) {
    const auto got = d.get(key(i), viewer(i), t);
    if (got && *got == (i % 3 == 0)) ++kept;
  }
  CHECK(kept == 999);
  for (int i = 1; i <= 4000; ++i) {
    if (d.get(key(i), viewer(i), t)) FAIL("decision " << i << " outlived the bound");
  }
  d.forget(key(0));
  CHECK_FALSE(d.get(key(0), viewer(0), t));
  CHECK(d.size() < 1000);
}

TEST_CASE("expired decisions are evicted by later puts") {
  Decisions d(1min, 1000);
  const auto t = Decisions::Clock::now();
  for (int i = 0; i < 100; ++i) d.put("k", "old:" + std::to_string(i), true, t);
  CHECK(d.size() == 100);
  for (int i = 0; i < 20; ++i) d.put("k2", "new:" + std::to_string(i), false, t + 1min);
  CHECK(d.size() == 20);
  CHECK_FALSE(d.get("k", "old:0", t + 1min));
  CHECK(d.get("k2", "new:19", t + 1min) == false);
  // A refreshed decision lives on from its last put.
  d.put("k2", "new:0", true, t + 2min - 1ms);
  for (int i = 0; i < 3; ++i) d.put("k3", "v" + std::to_string(i), true, t + 2min);
  CHECK(d.get("k2", "new:0", t + 2min) == true);
  CHECK(d.size() == 4);
}

TEST_CASE("generations stay bounded however many keys are forgotten") {
  Decisions d(5min, 1000, 1000);
  const auto t = Decisions::Clock::now();
  CHECK(d.generation("never") == 0);
  uint64_t last = 0;
  for (int i = 0; i < 100000; ++i) {
    const std::string key = "key:" + std::to_string(i);
    const auto before = d.generation(key);
    d.forget(key);
    const auto after = d.generation(key);
    if (after <= before || after <= last) FAIL("forget " << i << " did not raise the generation");
    last = after;
    CHECK_FALSE(d.put_if_current(key, "v", true, t, before));
  }
  CHECK(d.generations_size() <= 1000);
  // Long forgotten keys still read a generation at least as high as their last forget's.
  CHECK(d.generation("key:0") >= 1);
  const auto g = d.generation("key:0");
  CHECK(d.put_if_current("key:0", "v", true, t, g));
  CHECK(d.get("key:0", "v", t) == true);
}

TEST_CASE("a forget is never missed by put_if_current, also once evicted from generations") {
  Decisions d(5min, 10000, 100);
  const auto t = Decisions::Clock::now();
  std::mt19937 rng(7);
  auto key = [&] { return "k" + std::to_string(rng() % 5000); };
  int spurious = 0;
  for (int step = 0; step < 50000; ++step) {
    const std::string a = key();
    const auto g = d.generation(a);
    bool forgotten = false;
    const int forgets = rng() % 4;
    for (int i = 0; i < forgets; ++i) {
      const std::string b = rng() % 10 == 0 ? a : key();
      forgotten = forgotten || b == a;
      d.forget(b);
    }
    const bool cached = d.put_if_current(a, "v", true, t, g);
    if (forgotten && cached) FAIL("step " << step << ": a forget of " << a << " was missed");
    if (forgets == 0 && !cached) FAIL("step " << step << ": nothing was forgotten");
    if (!forgotten && !cached) ++spurious;
  }
  CHECK(d.generations_size() <= 100);
  CHECK(spurious < 500);  // one in ~4,096 hash buckets per eviction
}

TEST_CASE("decisions stand concurrent use") {
  Decisions d(50ms, 500, 50);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(w);
      for (int i = 0; i < 20000; ++i) {
        const auto now = Decisions::Clock::now();
        const std::string k = "k" + std::to_string(rng() % 50);
        const std::string v = "v" + std::to_string(rng() % 50);
        switch (rng() % 4) {
          case 0:
            d.forget(k);
            break;
          case 1:
            d.put_if_current(k, v, (k.size() + v.size()) % 2 == 0, now, d.generation(k));
            break;
          default:
            if (auto got = d.get(k, v, now); got && *got != ((k.size() + v.size()) % 2 == 0))
              ++wrong;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong == 0);
  CHECK(d.size() <= 500);
  CHECK(d.generations_size() <= 50);
}
