// A socket's Feed against fakes: a sink that records frames (and says how much waits), an owner
// that records what the feed tells the protocol, a window, hand-offs and decisions of the test's
// own. No sockets, no threads besides the test's.
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "access/decider.hpp"
#include "fanout/frame.hpp"
#include "session/feed.hpp"

using namespace outlive;
using json = nlohmann::json;

namespace {

const topic::TopicIdentity kTopic{"app", 7};

class FakePort final : public session::FeedSink, public session::FeedOwner {
 public:
  // FeedSink
  void send(ws::Frame frame) override {
    std::string text = frame.own;
    if (frame.head) text += *frame.head;
    if (frame.shared) text += *frame.shared;
    frames.push_back(json::parse(text));
    shared.push_back(frame.shared);
  }
  size_t queued_bytes() const override { return queued; }
  void cork() override { ++corks; }
  void uncork() override {}
  void close(uint16_t code, const std::string&) override {
    close_code = code;
    closed = true;
  }
  bool closing() const override { return closed; }

  // FeedOwner
  const fanout::Viewer* viewer() const override { return &viewer_; }
  void unfollow(const std::string&, const std::string& key) override { unfollowed.push_back(key); }
  void end_subscription(const std::string& id) override { ended.push_back(id); }
  void settle(uint64_t position) override { settled = position; }
  void unsettle() override { settled = 0; }
  void count_frames(uint64_t n) override { counted += n; }
  void catch_up_started() override { ++catch_ups; }
  void feed_changed() override {}
  void ask_decision(const std::string& key, const std::string& channel,
                    std::function<void(bool)> answered) override {
    asked.emplace_back(key + "/" + channel, std::move(answered));
  }
  boost::asio::any_io_executor feed_executor() override { return io.get_executor(); }
  std::shared_ptr<void> keep_alive() override { return nullptr; }

  std::vector<json> frames;
  std::vector<std::shared_ptr<const std::string>> shared;
  size_t queued = 0;
  int corks = 0;
  bool closed = false;
  uint16_t close_code = 0;
  std::vector<std::string> unfollowed, ended;
  uint64_t settled = 0;
  uint64_t counted = 0;
  int catch_ups = 0;
  std::vector<std::pair<std::string, std::function<void(bool)>>> asked;
  boost::asio::io_context io;
  fanout::Viewer viewer_{"v", R"({"id":"v"})"};
};

struct Fixture {
  // `progress_after`: 1 sends progress whenever the topic moved (most tests below).
  explicit Fixture(uint64_t progress_after = 1,
                   std::chrono::milliseconds quiet = std::chrono::seconds(30)) {
    source.app = "app";
    source.window = &window;
    source.hand_offs = &hand_offs;
    source.identity = kTopic;
    source.decisions = &decisions;
    source.max_mailbox = 4;
    source.progress_after_updates = progress_after;
    source.progress_quiet = quiet;
    source.send_buffer_bytes = 1000;
    source.replay_send_buffer_bytes = 2000;
    feed.bind(source);
  }
  void follow(const std::string& id, std::vector<std::string> keys, uint64_t from = 0) {
    session::Subscription sub;
    sub.channel = "ch";
    for (const auto& k : keys) sub.keys.emplace(k, from);
    subs.add(id, std::move(sub));
  }
  void decide(const std::string& key, bool allowed) {
    decisions.put(key, access::Decider::decision_id("app", "ch", "v"), allowed,
                  access::Decisions::Clock::now());
  }
  // An update in the window, taken by the dispatcher and (unless `waiting`) handed off.
  window::UpdatePtr append(uint64_t position, const std::string& key, bool waiting = false) {
    window::Update u;
    u.position = position;
    u.key = key;
    u.data_json = std::make_shared<const std::string>(R"({"at":)" + std::to_string(position) + "}");
    fanout::prepare(u, kTopic);
    auto p = std::make_shared<const window::Update>(std::move(u));
    window.append(p);
    hand_offs.taken(position);
    if (!waiting) hand_offs.handed(position);
    return p;
  }
  // What the dispatcher would hand this socket for `u` (allowed through "ch").
  fanout::Delivery live(const window::UpdatePtr& u, bool allowed = true) {
    auto out =
        std::make_shared<const fanout::OutgoingUpdate>(fanout::outgoing(u, u->position, kTopic));
    return fanout::Delivery{out, {{"ch", allowed}}, false, 0};
  }
  std::string cursor(uint64_t position) { return topic::Cursor::at(kTopic, position).encode(); }
  std::vector<json> updates() {
    std::vector<json> out;
    for (const auto& f : port.frames)
      if (f["type"] == "update") out.push_back(f);
    return out;
  }

  FakePort port;
  session::Subscriptions subs;
  window::Window window;
  fanout::HandOffs hand_offs;
  access::Decisions decisions;
  session::FeedSource source;  // the app's, shared by its sockets: outlives the feed
  session::Feed feed{port, port, subs};
};

}  // namespace

TEST_CASE("feed: a live round goes out as update frames sharing the update's tail") {
  Fixture f;
  f.follow("s1", {"k"});
  const auto u = f.append(1, "k");
  std::vector<fanout::Delivery> round{f.live(u)};
  CHECK(f.feed.offer(std::move(round), 1));  // the first offer asks for a take
  CHECK_FALSE(f.feed.offer({}, 1));          // one take waits at most
  f.feed.take_mailbox();
  const auto sent = f.updates();
  REQUIRE(sent.size() == 1);
  CHECK(sent[0]["ids"] == json::array({"s1"}));
  CHECK(sent[0]["cursor"] == f.cursor(1));
  CHECK(sent[0]["data"] == json{{"at", 1}});
  CHECK(f.port.shared[0] == u->tail);  // the window's bytes, not a copy
  CHECK(f.port.counted == 1);
  CHECK_FALSE(f.feed.catching_up());
}

TEST_CASE("feed: a mailbox of max_mailbox stays live, one more catches up from the window") {
  Fixture f;
  f.follow("s1", {"k"});
  f.decide("k", true);
  std::vector<window::UpdatePtr> us;
  for (uint64_t p = 1; p <= 5; ++p) us.push_back(f.append(p, "k"));
  std::vector<fanout::Delivery> four;
  for (size_t i = 0; i < 4; ++i) four.push_back(f.live(us[i]));
  f.feed.offer(std::move(four), 4);  // exactly max_mailbox: still live
  f.feed.take_mailbox();
  CHECK(f.port.catch_ups == 0);
  CHECK(f.updates().size() == 4);

  std::vector<fanout::Delivery> five;
  for (size_t i = 0; i < 5; ++i) five.push_back(f.live(us[i]));
  f.feed.offer(std::move(five), 5);  // one past it: the socket reads the window instead
  f.feed.take_mailbox();
  CHECK(f.port.catch_ups == 1);
  const auto sent = f.updates();
  REQUIRE(sent.size() == 5);  // 1-4 once (per-key positions drop the repeats), then 5
  CHECK(sent[4]["cursor"] == f.cursor(5));
  CHECK_FALSE(f.feed.catching_up());  // the window's end: live again
}

TEST_CASE("feed: the live send buffer: below its size live, at its size the socket catches up") {
  Fixture f;
  f.follow("s1", {"k"});
  f.decide("k", true);
  const auto u1 = f.append(1, "k");
  const auto u2 = f.append(2, "k");
  f.port.queued = 999;
  f.feed.offer({f.live(u1)}, 1);
  f.feed.take_mailbox();
  CHECK(f.port.catch_ups == 0);
  CHECK(f.updates().size() == 1);
  f.port.queued = 1000;
  f.feed.offer({f.live(u2)}, 2);
  f.feed.take_mailbox();
  CHECK(f.port.catch_ups == 1);
  CHECK(f.updates().size() == 2);  // from the window (its buffer is 2,000)
}

TEST_CASE("feed: catching up sends only handed-off updates, its cursor below a key still waiting") {
  Fixture f;
  f.follow("s1", {"a", "b"});
  f.decide("a", true);
  f.decide("b", true);
  f.append(1, "a", /*waiting=*/true);  // its authorize() is out: it will arrive live
  f.append(2, "b");
  f.feed.start_catch_up(0);
  f.feed.pump();
  auto sent = f.updates();
  REQUIRE(sent.size() == 1);
  CHECK(sent[0]["key"] == "b");
  CHECK(sent[0]["cursor"] == f.cursor(0));  // a tab resuming from it still receives a@1
  CHECK_FALSE(f.feed.catching_up());        // live again: a@1 comes in a round
  f.hand_offs.handed(1);
  f.feed.offer({f.live(f.window.since(0)->front())}, 2);
  f.feed.take_mailbox();
  sent = f.updates();
  REQUIRE(sent.size() == 2);
  CHECK(sent[1]["key"] == "a");
  CHECK(sent[1]["cursor"] == f.cursor(1));
}

TEST_CASE("feed: a decision the catch-up misses is asked for, and the pass goes on with it") {
  Fixture f;
  f.follow("s1", {"k"});
  f.append(1, "k");
  f.feed.start_catch_up(0);
  f.feed.pump();
  CHECK(f.updates().empty());
  REQUIRE(f.port.asked.size() == 1);
  CHECK(f.port.asked[0].first == "k/ch");
  f.port.asked[0].second(false);  // revoked: a single-key subscription ends
  REQUIRE(f.port.frames.size() == 1);
  CHECK(f.port.frames[0]["type"] == "revoked");
  CHECK(f.port.ended == std::vector<std::string>{"s1"});
}

TEST_CASE("feed: a broken delivery closes the socket with 1011 and sends nothing after it") {
  Fixture f;
  f.follow("s1", {"k"});
  const auto u1 = f.append(1, "k");
  const auto u2 = f.append(2, "k");
  auto broken = f.live(u1);
  broken.broken = true;
  f.feed.offer({broken, f.live(u2)}, 2);
  f.feed.take_mailbox();
  CHECK(f.port.closed);
  CHECK(f.port.close_code == 1011);
  CHECK(f.updates().empty());
}

TEST_CASE("feed: the topic's lost positions resync the subscriptions short of them") {
  Fixture f;
  f.follow("s1", {"k"});
  f.follow("s2", {"j"}, 10);
  f.feed.offer({fanout::Delivery{nullptr, {}, false, 5}}, 5);
  f.feed.take_mailbox();
  REQUIRE(f.port.frames.size() == 1);
  CHECK(f.port.frames[0]["type"] == "resync");
  CHECK(f.port.frames[0]["id"] == "s1");
  CHECK(f.port.frames[0]["reason"] == "window");
  CHECK(f.port.frames[0]["cursor"] == f.cursor(5));
}

TEST_CASE("feed: a reader marked to end by a disconnect is told no position past it in progress") {
  SECTION("live") {
    Fixture f;
    f.follow("s1", {"k"});
    const auto u1 = f.append(1, "k");
    f.append(2, "d");  // the events.disconnect (no reader follows it)
    const auto u3 = f.append(3, "k");
    f.feed.end_after(2);
    f.feed.offer({f.live(u1), f.live(u3)}, 3);
    f.feed.take_mailbox();
    REQUIRE(f.updates().size() == 1);  // u3 is after the disconnect
    f.feed.on_progress({3, nullptr});           // everything up to 3 handed off, the close not run yet
    std::vector<json> progress;
    for (const auto& fr : f.port.frames)
      if (fr["type"] == "progress") progress.push_back(fr);
    REQUIRE(progress.size() == 1);
    const auto c = topic::Cursor::decode(progress[0]["cursor"].get<std::string>());
    REQUIRE(c);
    CHECK(c->position == 2);
    CHECK(f.port.settled < 3);  // not settled past its end either
  }
  SECTION("catching up, the pass past the disconnect and waiting for a decision") {
    Fixture f;
    f.follow("s1", {"k", "j"});
    f.decide("k", true);  // none for j: the pass waits at 4
    f.append(1, "k");
    f.append(2, "d");
    f.append(3, "k");
    f.append(4, "j");
    f.feed.end_after(2);
    f.feed.start_catch_up(0);
    f.feed.pump();
    REQUIRE(f.feed.catching_up());
    REQUIRE(f.port.asked.size() == 1);
    REQUIRE(f.updates().size() == 1);
    f.feed.on_progress({4, nullptr});
    std::vector<json> progress;
    for (const auto& fr : f.port.frames)
      if (fr["type"] == "progress") progress.push_back(fr);
    REQUIRE(progress.size() == 1);
    const auto c = topic::Cursor::decode(progress[0]["cursor"].get<std::string>());
    REQUIRE(c);
    CHECK(c->position <= 2);
  }
}

namespace {
std::vector<json> progress_frames(const FakePort& port) {
  std::vector<json> out;
  for (const auto& fr : port.frames)
    if (fr["type"] == "progress") out.push_back(fr);
  return out;
}
}  // namespace

TEST_CASE("feed: progress only once the tab's oldest cursor is progress_after_updates behind") {
  Fixture f(4);
  f.follow("s1", {"k"});
  f.feed.subscribed_at(0);
  for (uint64_t p = 1; p <= 3; ++p) f.append(p, "other");
  f.feed.on_progress({3, nullptr});
  CHECK(progress_frames(f.port).empty());  // 3 behind: its cursor is nowhere near the window's end
  f.append(4, "other");
  const auto tick = std::make_shared<const std::string>(
      json{{"type", "progress"}, {"cursor", f.cursor(4)}}.dump());
  f.feed.on_progress({4, tick});
  const auto progress = progress_frames(f.port);
  REQUIRE(progress.size() == 1);
  CHECK(progress[0]["cursor"] == f.cursor(4));
  CHECK(f.port.shared.back() == tick);  // the tick's frame, not one of the socket's own
}

TEST_CASE("feed: an update frame for every subscription restarts the count, one for some does not") {
  SECTION("one subscription") {
    Fixture f(4);
    f.follow("s1", {"k"});
    f.feed.subscribed_at(0);
    f.append(1, "other");
    f.append(2, "other");
    const auto u3 = f.append(3, "k");
    f.feed.offer({f.live(u3)}, 3);
    f.feed.take_mailbox();
    REQUIRE(f.updates().size() == 1);
    for (uint64_t p = 4; p <= 6; ++p) f.append(p, "other");
    f.feed.on_progress({6, nullptr});
    CHECK(progress_frames(f.port).empty());  // 3 past its update's cursor
    f.append(7, "other");
    f.feed.on_progress({7, nullptr});
    REQUIRE(progress_frames(f.port).size() == 1);
    CHECK(progress_frames(f.port)[0]["cursor"] == f.cursor(7));
  }
  SECTION("two subscriptions, the update for one of them") {
    Fixture f(4);
    f.follow("s1", {"k"});
    f.feed.subscribed_at(0);
    f.follow("s2", {"j"});
    f.feed.subscribed_at(0);
    const auto u3 = f.append(3, "k");
    f.feed.offer({f.live(u3)}, 3);
    f.feed.take_mailbox();
    REQUIRE(f.updates().size() == 1);
    f.append(4, "other");
    // s2 still holds the cursor it subscribed with: 4 behind it.
    f.feed.on_progress({4, nullptr});
    REQUIRE(progress_frames(f.port).size() == 1);
    CHECK(progress_frames(f.port)[0]["cursor"] == f.cursor(4));
  }
}

// The dispatcher issues ticks a second apart; a socket's io thread handles each a little late,
// by a different amount each time. Counted in the io thread's time, a tick handled 5 ms sooner
// after its predecessor than it was issued was skipped, and the socket heard progress every other
// second (replay: "a progress frame sent during a burst ..." saw none inside a burst under ASan).
TEST_CASE("feed: ticks issued a second apart each bring progress, however late each is handled") {
  Fixture f(1);
  f.follow("s1", {"k"});
  f.feed.subscribed_at(0);
  const auto t0 = std::chrono::steady_clock::now();
  f.append(1, "other");
  f.feed.on_progress({1, nullptr, t0});
  REQUIRE(progress_frames(f.port).size() == 1);
  f.append(2, "other");
  f.feed.on_progress({2, nullptr, t0 + std::chrono::seconds(1)});  // handled at once
  REQUIRE(progress_frames(f.port).size() == 2);
  CHECK(progress_frames(f.port)[1]["cursor"] == f.cursor(2));
  f.append(3, "other");
  f.feed.on_progress({3, nullptr, t0 + std::chrono::milliseconds(1999)});  // a tick too soon
  CHECK(progress_frames(f.port).size() == 2);
}

TEST_CASE("feed: after progress_quiet a cursor behind the topic hears progress however little it moved") {
  Fixture f(1000, std::chrono::milliseconds(0));
  f.follow("s1", {"k"});
  f.feed.subscribed_at(0);
  f.append(1, "other");
  f.feed.on_progress({1, nullptr});
  REQUIRE(progress_frames(f.port).size() == 1);
  CHECK(progress_frames(f.port)[0]["cursor"] == f.cursor(1));
  f.append(2, "other");
  f.feed.on_progress({2, nullptr});
  CHECK(progress_frames(f.port).size() == 1);  // at most once a second
}
