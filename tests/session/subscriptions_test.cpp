// Subscriptions of one socket (src/session/subscriptions): positions per key, what an update does.
#include <catch2/catch.hpp>

#include "session/subscriptions.hpp"

using namespace outlive;
using session::Effect;
using session::Subscription;
using session::Subscriptions;

namespace {

window::Update data_update(uint64_t position, const std::string& key) {
  window::Update u;
  u.position = position;
  u.key = key;
  u.kind = window::Kind::data;
  u.data_json = std::make_shared<const std::string>("{}");
  return u;
}

Subscription single(const std::string& key, uint64_t from, const std::string& channel = "w") {
  Subscription s;
  s.channel = channel;
  s.keys.emplace(key, from);
  return s;
}

const fanout::ChannelAccess kAllowed{{"w", true}};
const fanout::ChannelAccess kDenied{{"w", false}};

}  // namespace

TEST_CASE("an update reaches the subscriptions of its key once, and keys keep their own positions") {
  Subscriptions subs;
  subs.add("a", single("A", 10));
  subs.add("b", single("B", 10));
  Effect e;
  subs.apply(data_update(12, "B"), "c12", kAllowed, e);
  CHECK(e.update_ids == std::vector<std::string>{"b"});
  // A's earlier update, handed off later (its authorize was slow), is not taken for a duplicate.
  e.clear();
  subs.apply(data_update(11, "A"), "c11", kAllowed, e);
  CHECK(e.update_ids == std::vector<std::string>{"a"});
  // The same update again (live and catch-up both bring it): nothing.
  e.clear();
  subs.apply(data_update(11, "A"), "c11", kAllowed, e);
  CHECK_FALSE(e.applied);
  CHECK(e.update_ids.empty());
  // An update at or before where the subscription started: nothing.
  e.clear();
  subs.apply(data_update(10, "B"), "c10", kAllowed, e);
  CHECK_FALSE(e.applied);
  CHECK(subs.lowest_position() == 11);
}

TEST_CASE("losing access ends a single-key subscription and drops a collection's key") {
  Subscriptions subs;
  subs.add("one", single("K", 1));
  Subscription coll;
  coll.channel = "w";
  coll.collection = true;
  coll.keys = {{"K", 1}, {"L", 1}};
  subs.add("all", coll);
  Effect e;
  subs.apply(data_update(2, "K"), "c2", kDenied, e);
  CHECK(e.update_ids.empty());
  CHECK(e.ended == std::vector<std::string>{"one"});
  REQUIRE(e.frames.size() == 2);
  CHECK(e.frames[0].find("\"resync\"") != std::string::npos);  // the collection, "all" < "one"
  CHECK(e.frames[0].find("\"access\"") != std::string::npos);
  CHECK(e.frames[1].find("\"revoked\"") != std::string::npos);
  CHECK(e.dropped == std::vector<std::pair<std::string, std::string>>{{"w", "K"}});
  CHECK(subs.all().at("all").keys.count("K") == 0);
  CHECK(subs.follows("K"));  // "one" still follows it until the socket ends it
  subs.remove("one");
  CHECK_FALSE(subs.follows("K"));
  CHECK(subs.follows("L"));
}

TEST_CASE("behind, bring_to and replace_keys keep the positions a catch-up starts from") {
  Subscriptions subs;
  subs.add("a", single("A", 5));
  subs.add("b", single("B", 50));
  CHECK(subs.behind(20) == std::vector<std::string>{"a"});
  subs.bring_to("a", 60);
  CHECK(subs.behind(20).empty());
  CHECK(subs.lowest_position() == 50);
  Subscription coll;
  coll.channel = "w";
  coll.collection = true;
  coll.keys = {{"X", 70}};
  subs.add("c", coll);
  const auto [gained, lost] = subs.replace_keys("c", {"Y"}, 80);
  CHECK(gained == std::set<std::string>{"Y"});
  CHECK(lost == std::set<std::string>{"X"});
  CHECK_FALSE(subs.follows("X"));
  CHECK(subs.all().at("c").keys.at("Y") == 80);
  CHECK(subs.wants(data_update(81, "Y")));
  CHECK_FALSE(subs.wants(data_update(80, "Y")));
}

TEST_CASE("bring_all_to raises every key of every subscription and lowers none") {
  Subscriptions subs;
  subs.add("a", single("A", 5));
  subs.add("b", single("B", 90));
  subs.bring_all_to(40);
  CHECK(subs.all().at("a").keys.at("A") == 40);
  CHECK(subs.all().at("b").keys.at("B") == 90);
  CHECK(subs.lowest_position() == 40);
  CHECK_FALSE(subs.wants(data_update(40, "A")));
  CHECK(subs.wants(data_update(41, "A")));
}

TEST_CASE("an oversized update reaches its subscriptions as a resync") {
  Subscriptions subs;
  subs.add("a", single("A", 1));
  window::Update u;
  u.position = 2;
  u.key = "A";
  u.kind = window::Kind::resync;
  Effect e;
  subs.apply(u, "c2", kAllowed, e);
  REQUIRE(e.frames.size() == 1);
  CHECK(e.frames[0].find("\"oversized\"") != std::string::npos);
  CHECK(e.update_ids.empty());
}
