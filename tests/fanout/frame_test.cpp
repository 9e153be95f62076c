// The one function that turns an update into a reader's delivery, live and catching up alike
// (fanout/frame.hpp): the reader's access from the decision cache, the cursor clamp, the tail.
// Hermetic: a decision cache of the test's own, no threads.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "access/decider.hpp"
#include "fanout/frame.hpp"

using namespace outlive;
using namespace std::chrono_literals;
using Clock = access::Decisions::Clock;

namespace {

const topic::TopicIdentity kTopic{"app", 9};

std::string cursor(uint64_t position) { return topic::Cursor::at(kTopic, position).encode(); }

window::UpdatePtr update(uint64_t position, const std::string& key, bool with_data = true) {
  window::Update u;
  u.position = position;
  u.key = key;
  if (with_data) {
    u.data_json = std::make_shared<const std::string>(R"({"n":1})");
  } else {
    u.kind = window::Kind::access;
    u.access = true;
  }
  fanout::prepare(u, kTopic);
  return std::make_shared<const window::Update>(std::move(u));
}

struct Cache {
  void put(const std::string& key, const std::string& channel, const std::string& viewer,
           bool allowed) {
    decisions.put(key, access::Decider::decision_id("app", channel, viewer), allowed, now);
  }
  fanout::DecisionLookup at() const { return {decisions, app, now}; }

  access::Decisions decisions{5min};
  const std::string app = "app";
  Clock::time_point now = Clock::now();
};

}  // namespace

TEST_CASE("frame: access is read per channel in order, a missing decision refused and marked") {
  Cache c;
  c.put("k", "a", "v", true);
  c.put("k", "c", "v", false);
  fanout::Access access;
  const std::vector<std::string> channels{"a", "b", "c"};
  CHECK(fanout::read_access(c.at(), "k", channels, "v", access) == 1);
  REQUIRE(access.allowed.size() == 3);
  CHECK(access.allowed[0] == std::pair<std::string, bool>{"a", true});
  CHECK(access.allowed[1] == std::pair<std::string, bool>{"b", false});
  CHECK(access.allowed[2] == std::pair<std::string, bool>{"c", false});
  CHECK(access.missing == 0b010u);

  fanout::Access other;  // another viewer, another key: nothing cached
  CHECK(fanout::read_access(c.at(), "k", channels, "w", other) == 0);
  CHECK(other.missing == 0b111u);
  fanout::Access known;
  CHECK(fanout::read_access(c.at(), "k", std::vector<std::string>{"a", "c"}, "v", known) ==
        fanout::kNoneMissing);
  CHECK(known.missing == 0);
}

TEST_CASE("frame: the dispatcher's channel pointers read the same decisions as channel names") {
  Cache c;
  c.put("k", "a", "v", true);
  const std::string a = "a", b = "b";
  boost::container::small_vector<const std::string*, 1> pointers{&a, &b};
  fanout::Access by_pointer, by_name;
  CHECK(fanout::read_access(c.at(), "k", pointers, "v", by_pointer) == 1);
  CHECK(fanout::read_access(c.at(), "k", std::vector<std::string>{a, b}, "v", by_name) == 1);
  CHECK(by_pointer.allowed == by_name.allowed);
  CHECK(by_pointer.missing == by_name.missing);
}

TEST_CASE("frame: none held reads nothing from the cache, an answer wins over the cache") {
  Cache c;
  c.put("k", "a", "v", true);
  auto lookup = c.at();
  lookup.none_held = true;  // the key's access update forgot them: every one is asked again
  fanout::Access access;
  CHECK(fanout::read_access(lookup, "k", std::vector<std::string>{"a"}, "v", access) == 0);
  CHECK(access.allowed[0].second == false);
  CHECK(access.missing == 1u);

  // authorize() answered "refused" for (k, a) after the access update: it answers this update
  // even though the cache still holds the older "allowed".
  const fanout::Answered answered{"k", "a", false};
  auto with_answer = c.at();
  with_answer.answered = &answered;
  fanout::Access answered_access;
  CHECK(fanout::read_access(with_answer, "k", std::vector<std::string>{"a"}, "v",
                            answered_access) == fanout::kNoneMissing);
  CHECK(answered_access.allowed[0].second == false);
  fanout::Access other_key;  // the answer is of (k, a) only
  CHECK(fanout::read_access(with_answer, "j", std::vector<std::string>{"a"}, "v", other_key) == 0);
}

TEST_CASE("frame: the earliest expiry of the decisions read is reported, missing ones add none") {
  Cache c;
  c.put("k", "a", "v", true);
  c.now += 1min;
  c.put("k", "b", "v", true);  // expires a minute after the first
  auto expires = Clock::time_point::max();
  auto lookup = c.at();
  lookup.expires = &expires;
  fanout::Access access;
  CHECK(fanout::read_access(lookup, "k", std::vector<std::string>{"b", "x", "a"}, "v", access) ==
        1);
  CHECK(expires == c.now - 1min + 5min);
  // Past that expiry the first decision is gone: missing, not refused for good.
  c.now += 4min;
  fanout::Access later;
  CHECK(fanout::read_access(c.at(), "k", std::vector<std::string>{"a", "b"}, "v", later) == 0);
  CHECK(later.missing == 1u);
}

TEST_CASE("frame: channels up to the 32nd get a missing bit, the 33rd is refused unmarked") {
  Cache c;
  std::vector<std::string> channels;
  for (int i = 0; i < 33; ++i) channels.push_back("c" + std::to_string(i));
  for (int i = 0; i < 31; ++i) c.put("k", channels[i], "v", true);
  fanout::Access access;
  // c31 (the 32nd) and c32 (the 33rd) have no decision.
  CHECK(fanout::read_access(c.at(), "k", channels, "v", access) == 31);
  CHECK(access.missing == (1u << 31));
  CHECK(access.allowed.size() == 33);
  CHECK(access.allowed[32].second == false);

  c.put("k", "c31", "v", true);
  fanout::Access only_33rd;
  // Still reported (catch-up asks for it), with no bit (live delivery refuses it).
  CHECK(fanout::read_access(c.at(), "k", channels, "v", only_33rd) == 32);
  CHECK(only_33rd.missing == 0);
}

TEST_CASE(
    "frame: the cursor clamp stays below other keys' first unsent update, and early below "
    "its own") {
  fanout::CursorClamp none;
  CHECK(none.cursor_for(10) == 10);
  fanout::CursorClamp above;
  above.below(20);  // an unsent update after this one holds nothing back
  CHECK(above.cursor_for(10) == 10);
  fanout::CursorClamp at_next;
  at_next.below(10 + 1);
  at_next.below(12);
  CHECK(at_next.cursor_for(10) == 10);
  fanout::CursorClamp before;
  before.below(12);
  before.below(7);  // the lowest wins
  CHECK(before.cursor_for(10) == 6);
  fanout::CursorClamp early(true);
  CHECK(early.cursor_for(10) == 9);
  early.below(5);
  CHECK(early.cursor_for(10) == 4);
}

TEST_CASE("frame: an unclamped frame shares the update's tail, a clamped one has its own") {
  const auto u = update(10, "k");
  fanout::Access access;
  access.allowed.emplace_back("ch", true);
  std::shared_ptr<const fanout::OutgoingUpdate> shared;
  const auto d = fanout::reader_frame(
      u, std::move(access), [] { return fanout::CursorClamp(); }, kTopic, shared);
  REQUIRE(d.out);
  CHECK(d.out == shared);
  CHECK(d.out->update == u);
  CHECK(d.out->cursor == cursor(10));
  CHECK(d.out->tail == u->tail);  // the same bytes, not a copy
  CHECK(d.allowed.size() == 1);
  CHECK(d.allowed[0] == std::pair<std::string, bool>{"ch", true});
  CHECK_FALSE(d.broken);

  std::shared_ptr<const fanout::OutgoingUpdate> clamped;
  const auto c = fanout::reader_frame(
      u, fanout::Access{},
      [] {
        fanout::CursorClamp clamp;
        clamp.below(4);
        return clamp;
      },
      kTopic, clamped);
  CHECK(c.out->cursor == cursor(3));
  REQUIRE(c.out->tail);
  CHECK(c.out->tail != u->tail);
  CHECK(c.out->tail->find(cursor(3)) != std::string::npos);
  CHECK(c.out->tail->find(cursor(10)) == std::string::npos);
}

TEST_CASE("frame: the update's frame is built once for all its readers, each with its access") {
  const auto u = update(5, "k");
  std::shared_ptr<const fanout::OutgoingUpdate> shared;
  int clamps = 0;
  const auto clamp = [&] {
    ++clamps;
    fanout::CursorClamp c;
    c.below(3);
    return c;
  };
  fanout::Access first, second;
  first.allowed.emplace_back("ch", true);
  second.allowed.emplace_back("ch", false);
  second.broken = true;
  const auto a = fanout::reader_frame(u, std::move(first), clamp, kTopic, shared);
  const auto b = fanout::reader_frame(u, std::move(second), clamp, kTopic, shared);
  CHECK(clamps == 1);  // the first reader's clamp holds for the rest
  CHECK(a.out == b.out);
  CHECK(b.out->cursor == cursor(2));
  CHECK(a.allowed[0].second);
  CHECK_FALSE(b.allowed[0].second);
  CHECK_FALSE(a.broken);
  CHECK(b.broken);
}

TEST_CASE("frame: an update without data has no tail, clamped or not") {
  const auto u = update(5, "k", false);
  std::shared_ptr<const fanout::OutgoingUpdate> own, clamped;
  const auto d = fanout::reader_frame(
      u, fanout::Access{}, [] { return fanout::CursorClamp(); }, kTopic, own);
  CHECK(d.out->cursor == cursor(5));
  CHECK_FALSE(d.out->tail);
  const auto c = fanout::reader_frame(
      u, fanout::Access{}, [] { return fanout::CursorClamp(true); }, kTopic, clamped);
  CHECK(c.out->cursor == cursor(4));
  CHECK_FALSE(c.out->tail);
}

TEST_CASE("frame: a frame by value is the shared frame's twin, clamped the same") {
  const auto u = update(10, "k");
  const auto clamp = [] {
    fanout::CursorClamp c;
    c.below(4);
    return c;
  };
  const fanout::OutgoingUpdate own = fanout::reader_frame_value(
      u, [] { return fanout::CursorClamp(); }, kTopic);
  CHECK(own.update == u);
  CHECK(own.cursor == cursor(10));
  CHECK(own.tail == u->tail);  // the update's shared bytes, as live

  std::shared_ptr<const fanout::OutgoingUpdate> shared;
  fanout::reader_frame(u, fanout::Access{}, clamp, kTopic, shared);
  const fanout::OutgoingUpdate clamped = fanout::reader_frame_value(u, clamp, kTopic);
  REQUIRE(shared);
  CHECK(clamped.cursor == cursor(3));
  CHECK(clamped.cursor == shared->cursor);
  REQUIRE(clamped.tail);
  CHECK(*clamped.tail == *shared->tail);
}
