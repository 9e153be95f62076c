// AuthorizeJoins' rule (src/access/authorize_joins.hpp), without a database: a lone viewer starts
// at once, viewers join the batch that waits to start, later ones gather until a started batch
// answers, a full batch starts at once, and nothing is left behind.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "access/authorize_joins.hpp"

using outlive::access::AuthorizeAnswer;
using outlive::access::AuthorizeJoins;

namespace {

std::string viewer(int i) { return "u" + std::to_string(i); }
std::string viewer_json(int i) { return R"({"id":")" + viewer(i) + R"("})"; }

struct Told {
  std::map<std::string, std::vector<AuthorizeAnswer>> by_viewer;
  std::function<void(AuthorizeAnswer)> to(const std::string& id) {
    return [this, id](AuthorizeAnswer a) { by_viewer[id].push_back(std::move(a)); };
  }
};

AuthorizeAnswer allowing(const std::vector<std::string>& ids) {
  AuthorizeAnswer a;
  a.ok = true;
  a.allowed.insert(ids.begin(), ids.end());
  return a;
}

const AuthorizeJoins::Key kKey{"app", "doc", "doc:1", 7};

}  // namespace

TEST_CASE("a lone viewer's batch starts at once and is forgotten once answered") {
  AuthorizeJoins joins;
  Told told;
  auto batch = joins.join(kKey, viewer(1), viewer_json(1), told.to(viewer(1)), {});
  REQUIRE(batch);
  CHECK(batch->ids == std::vector<std::string>{viewer(1)});
  CHECK(batch->viewers_json() == R"([{"id":"u1"}])");
  joins.started(kKey, batch);
  const auto answer = allowing({viewer(1)});
  CHECK_FALSE(joins.finished(kKey, batch, &answer));
  REQUIRE(told.by_viewer[viewer(1)].size() == 1);
  CHECK(told.by_viewer[viewer(1)][0].ok);
  CHECK(told.by_viewer[viewer(1)][0].allowed.count(viewer(1)) == 1);
  CHECK(joins.pending_keys() == 0);
}

TEST_CASE("viewers join the batch that waits to start, later ones gather into one next batch") {
  AuthorizeJoins joins;
  Told told;
  auto first = joins.join(kKey, viewer(0), viewer_json(0), told.to(viewer(0)), {});
  REQUIRE(first);
  // While it waits for a worker: joined, nothing more to start.
  for (int v = 1; v < 5; ++v) CHECK_FALSE(joins.join(kKey, viewer(v), viewer_json(v), told.to(viewer(v)), {}));
  // The same viewer twice (two tabs): asked once, both told.
  CHECK_FALSE(joins.join(kKey, viewer(4), viewer_json(4), told.to(viewer(4)), {}));
  CHECK(first->ids.size() == 5);
  CHECK(first->waiters.size() == 6);
  joins.started(kKey, first);
  // Under way: the next ones gather and wait for it.
  for (int v = 5; v < 25; ++v) CHECK_FALSE(joins.join(kKey, viewer(v), viewer_json(v), told.to(viewer(v)), {}));
  const auto answer = allowing({viewer(0), viewer(2), viewer(4)});  // evens below 5
  auto second = joins.finished(kKey, first, &answer);
  REQUIRE(second);
  CHECK(second->ids.size() == 20);
  CHECK(told.by_viewer[viewer(4)].size() == 2);
  CHECK(told.by_viewer[viewer(2)][0].allowed == std::set<std::string>{viewer(2)});  // its own
  CHECK(told.by_viewer[viewer(3)][0].allowed.empty());
  CHECK(told.by_viewer.count(viewer(5)) == 0);
  // The gathered batch still takes viewers until it starts.
  CHECK_FALSE(joins.join(kKey, viewer(30), viewer_json(30), told.to(viewer(30)), {}));
  joins.started(kKey, second);
  AuthorizeAnswer failed;
  failed.error = "boom";
  CHECK_FALSE(joins.finished(kKey, second, &failed));
  REQUIRE(told.by_viewer[viewer(30)].size() == 1);
  CHECK_FALSE(told.by_viewer[viewer(30)][0].ok);
  CHECK(told.by_viewer[viewer(30)][0].error == "boom");
  CHECK(told.by_viewer.size() == 26);
  CHECK(joins.pending_keys() == 0);
}

TEST_CASE("a batch of 500 viewers starts at once: 1,200 asks of 1,000 viewers make 2 full batches and 1 more") {
  AuthorizeJoins joins(500);
  Told told;
  std::vector<std::shared_ptr<AuthorizeJoins::Batch>> launched;
  for (int v = 0; v < 1000; ++v) {
    for (int twice = 0; twice < (v % 5 == 0 ? 2 : 1); ++twice) {
      if (auto b = joins.join(kKey, viewer(v), viewer_json(v), told.to(viewer(v)), {}))
        launched.push_back(b);
    }
  }
  // The first batch was launched with viewer 0 and filled before it started; the second filled
  // while the first was under way, so it starts without waiting for it.
  REQUIRE(launched.size() == 2);
  CHECK(launched[0]->ids.size() == 500);
  CHECK(launched[1]->ids.size() == 500);
  CHECK(launched[0]->ids.front() == viewer(0));
  CHECK(launched[1]->ids.front() == viewer(500));
  // One more viewer: under way are two, so it gathers.
  CHECK_FALSE(joins.join(kKey, viewer(1000), viewer_json(1000), told.to(viewer(1000)), {}));
  for (auto& b : launched) joins.started(kKey, b);
  const auto answer = allowing({});
  // The gathered viewer starts when a batch under way answered.
  auto third = joins.finished(kKey, launched[0], &answer);
  REQUIRE(third);
  CHECK_FALSE(joins.finished(kKey, launched[1], &answer));
  CHECK(third->ids == std::vector<std::string>{viewer(1000)});
  joins.started(kKey, third);
  CHECK_FALSE(joins.finished(kKey, third, &answer));
  size_t told_count = 0;
  for (const auto& [id, answers] : told.by_viewer) told_count += answers.size();
  CHECK(told_count == 1201);
  CHECK(joins.pending_keys() == 0);
}

TEST_CASE("another key, channel, app or generation is another batch") {
  AuthorizeJoins joins;
  Told told;
  const std::vector<AuthorizeJoins::Key> keys{kKey,
                                              {"app", "doc", "doc:2", 7},
                                              {"app", "note", "doc:1", 7},
                                              {"other", "doc", "doc:1", 7},
                                              {"app", "doc", "doc:1", 8}};
  for (const auto& k : keys) CHECK(joins.join(k, viewer(1), viewer_json(1), told.to(viewer(1)), {}));
  CHECK(joins.pending_keys() == 5);
}

TEST_CASE("a batch nobody wants any more tells nobody and still starts the gathered one") {
  AuthorizeJoins joins;
  Told told;
  bool open = true;
  auto first = joins.join(kKey, viewer(1), viewer_json(1), told.to(viewer(1)), [&] { return open; });
  REQUIRE(first);
  joins.started(kKey, first);
  CHECK_FALSE(joins.join(kKey, viewer(2), viewer_json(2), told.to(viewer(2)), {}));
  open = false;
  CHECK_FALSE(first->wanted());
  auto next = joins.finished(kKey, first, nullptr);
  REQUIRE(next);
  CHECK(next->wanted());
  CHECK(told.by_viewer.empty());
  joins.started(kKey, next);
  const auto answer = allowing({viewer(2)});
  CHECK_FALSE(joins.finished(kKey, next, &answer));
  CHECK(told.by_viewer[viewer(2)].size() == 1);
  CHECK(joins.pending_keys() == 0);
}

TEST_CASE("a batch refused before it started answers its joiners and starts nothing of its own") {
  AuthorizeJoins joins;
  Told told;
  auto first = joins.join(kKey, viewer(1), viewer_json(1), told.to(viewer(1)), {});
  REQUIRE(first);
  CHECK_FALSE(joins.join(kKey, viewer(2), viewer_json(2), told.to(viewer(2)), {}));
  AuthorizeAnswer full;
  full.error = "the database pool has no room";
  CHECK_FALSE(joins.finished(kKey, first, &full));  // never started: it was still the open one
  CHECK(told.by_viewer[viewer(1)].at(0).error == full.error);
  CHECK(told.by_viewer[viewer(2)].at(0).error == full.error);
  CHECK(joins.pending_keys() == 0);
  // The next viewer starts afresh.
  CHECK(joins.join(kKey, viewer(3), viewer_json(3), told.to(viewer(3)), {}));
}
