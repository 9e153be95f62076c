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

TEST_CASE(
    "an update reaches the subscriptions of its key once, and keys keep their own positions") {
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
  subs.add("all", std::move(coll));
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
  subs.add("c", std::move(coll));
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

namespace {

window::Update data_of(uint64_t position, const std::string& key, const std::string& data) {
  window::Update u = data_update(position, key);
  u.data_json = std::make_shared<const std::string>(data);
  return u;
}

Subscription filtered(const std::string& key, uint64_t from, tab::Filter filter) {
  Subscription s = single(key, from);
  s.filter = std::make_shared<const tab::Filter>(std::move(filter));
  return s;
}

}  // namespace

TEST_CASE("a filter matches data equal on every field, numbers by value") {
  const auto u = data_of(1, "K", R"({"op":"deleted","qty":2,"ok":true,"gone":null,"n":{"a":1}})");
  const auto* fields = &u.scalar_fields();
  using session::matches;
  CHECK(matches({{"op", "deleted"}}, *fields));
  CHECK(matches({{"op", "deleted"}, {"qty", 2}, {"ok", true}, {"gone", nullptr}}, *fields));
  CHECK(matches({{"qty", 2.0}}, *fields));
  CHECK_FALSE(matches({{"op", "created"}}, *fields));
  CHECK_FALSE(matches({{"op", "deleted"}, {"qty", 3}}, *fields));
  CHECK_FALSE(matches({{"qty", "2"}}, *fields));          // a string is not the number
  CHECK_FALSE(matches({{"ok", 1}}, *fields));             // nor is 1 true
  CHECK_FALSE(matches({{"missing", nullptr}}, *fields));  // absent is not null
  CHECK_FALSE(matches({{"n", nullptr}}, *fields));        // a nested object equals no scalar
  // Data that is not an object has no fields.
  CHECK_FALSE(matches({{"op", "deleted"}}, data_of(1, "K", R"(["op","deleted"])").scalar_fields()));
  CHECK(matches({}, data_of(1, "K", "7").scalar_fields()));
}

TEST_CASE("an update a filter refuses is not for that subscription, which is brought past it") {
  Subscriptions subs;
  subs.add("del", filtered("K", 1, {{"op", "deleted"}}));
  subs.add("all", single("K", 1));
  Effect e;
  subs.apply(data_of(2, "K", R"({"op":"created"})"), "c2", kAllowed, e);
  CHECK(e.applied);
  CHECK(e.filtered);
  CHECK(e.update_ids == std::vector<std::string>{"all"});
  CHECK(subs.all().at("del").keys.at("K") == 2);  // not wanted again by a catch-up
  CHECK_FALSE(subs.wants(data_of(2, "K", R"({"op":"created"})")));
  e.clear();
  subs.apply(data_of(3, "K", R"({"op":"deleted","id":9})"), "c3", kAllowed, e);
  CHECK_FALSE(e.filtered);
  CHECK(e.update_ids == std::vector<std::string>{"all", "del"});
  // Nobody wants it: no update ids at all, so no frame.
  subs.remove("all");
  e.clear();
  subs.apply(data_of(4, "K", R"({"op":"created"})"), "c4", kAllowed, e);
  CHECK(e.applied);
  CHECK(e.filtered);
  CHECK(e.update_ids.empty());
  CHECK(e.frames.empty());
}

TEST_CASE("resync and revoked pass any filter, and so does an access update") {
  Subscriptions subs;
  subs.add("del", filtered("K", 1, {{"op", "deleted"}}));
  window::Update oversized;
  oversized.position = 2;
  oversized.key = "K";
  oversized.kind = window::Kind::resync;
  Effect e;
  subs.apply(oversized, "c2", kAllowed, e);
  REQUIRE(e.frames.size() == 1);
  CHECK(e.frames[0].find("\"oversized\"") != std::string::npos);
  CHECK_FALSE(e.filtered);
  // Access lost through an update the filter refuses: revoked all the same.
  e.clear();
  subs.apply(data_of(3, "K", R"({"op":"created"})"), "c3", kDenied, e);
  REQUIRE(e.frames.size() == 1);
  CHECK(e.frames[0].find("\"revoked\"") != std::string::npos);
  CHECK(e.ended == std::vector<std::string>{"del"});
  // An access update is applied whatever its data.
  Subscriptions other;
  other.add("del", filtered("K", 1, {{"op", "deleted"}}));
  window::Update access = data_of(4, "K", R"({"op":"created"})");
  access.kind = window::Kind::access;
  access.access = true;
  e.clear();
  other.apply(access, "c4", kAllowed, e);
  CHECK(e.applied);
  CHECK_FALSE(e.filtered);
}

TEST_CASE("an update's scalar fields are parsed once and shared") {
  const auto u = data_of(1, "K", R"({"a":1,"b":{"c":2},"d":[1]})");
  const auto* first = &u.scalar_fields();
  CHECK(first == &u.scalar_fields());
  CHECK(*first == nlohmann::json{{"a", 1}});
  // A copy of an update parses its own.
  const window::Update copy = u;
  CHECK(&copy.scalar_fields() != first);
  CHECK(copy.scalar_fields() == *first);
}
