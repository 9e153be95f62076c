// A connection's read side (ws/read_side): messages assembled across reads, a ping to answer, the
// tab's close, the limits that close (16 KiB, UTF-8), the inbox bound and the pause on the send
// queue, the early bytes. Pure: the test plays the socket and the send queue.
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support/raw_ws.hpp"
#include "ws/read_side.hpp"

using namespace outlive::ws;
using outlive::testing::client_frame;

namespace {

constexpr uint8_t kText = 0x1, kContinuation = 0x0, kClose = 0x8, kPing = 0x9, kPong = 0xA;

void feed(ReadSide& r, const std::string& bytes) { r.feed(bytes.data(), bytes.size()); }

// A text message as next_message() returns it.
std::optional<std::optional<std::string>> msg(std::string text) {
  return std::optional<std::string>(std::move(text));
}

std::string close_body(uint16_t code) {
  return {static_cast<char>(code >> 8), static_cast<char>(code & 0xFF)};
}

}  // namespace

TEST_CASE("read side: a message split over several reads waits once it is whole") {
  const ConnectionSettings s;
  ReadSide r(s);
  // Two fragments of one text message, cut inside a header and inside a payload.
  const std::string bytes =
      client_frame(kText, "hello ", false) + client_frame(kContinuation, "world", true);
  feed(r, bytes.substr(0, 1));
  CHECK_FALSE(r.take(0));
  feed(r, bytes.substr(1, 9));
  CHECK_FALSE(r.take(0));
  CHECK_FALSE(r.waiting());
  feed(r, bytes.substr(10, bytes.size() - 11));
  CHECK_FALSE(r.take(0));
  CHECK_FALSE(r.waiting());
  feed(r, bytes.substr(bytes.size() - 1));
  CHECK_FALSE(r.take(0));
  REQUIRE(r.waiting());
  CHECK(r.next_message() == msg("hello world"));
  CHECK_FALSE(r.waiting());
  CHECK_FALSE(r.next_message());
}

TEST_CASE("read side: a binary message waits as nullopt, in order with text") {
  const ConnectionSettings s;
  ReadSide r(s);
  feed(r, client_frame(kText, "a") + client_frame(0x2, "\x01\x02") + client_frame(kText, "b"));
  CHECK_FALSE(r.take(0));
  CHECK(r.next_message() == msg("a"));
  const auto binary = r.next_message();
  REQUIRE(binary);
  CHECK_FALSE(*binary);
  CHECK(r.next_message() == msg("b"));
}

TEST_CASE("read side: a ping is reported once for one pong, a pong needs nothing") {
  const ConnectionSettings s;
  ReadSide r(s);
  feed(r, client_frame(kText, "before") + client_frame(kPing, "p1") + client_frame(kPong, "x") +
              client_frame(kText, "after"));
  auto in = r.take(0);
  REQUIRE(in);
  CHECK(in->kind == Incoming::Kind::ping);
  CHECK(in->payload == "p1");
  // The message before the ping waits already: the pong goes out in the order they came.
  CHECK(r.waiting());
  CHECK_FALSE(r.take(0));  // the pong and the last message: nothing more to act on
  CHECK(r.next_message() == msg("before"));
  CHECK(r.next_message() == msg("after"));
  CHECK_FALSE(r.failed());
}

TEST_CASE("read side: the tab's close is reported with its code, 1005 without one") {
  const ConnectionSettings s;
  SECTION("with a code") {
    ReadSide r(s);
    feed(r, client_frame(kText, "m") + client_frame(kClose, close_body(4000) + "bye"));
    auto in = r.take(0);
    REQUIRE(in);
    CHECK(in->kind == Incoming::Kind::close);
    CHECK(in->code == 4000);
    CHECK(in->payload == "bye");
    CHECK(r.waiting());
    // Closing: what waits is not acted on.
    r.close();
    CHECK_FALSE(r.waiting());
    CHECK_FALSE(r.next_message());
  }
  SECTION("without a code") {
    ReadSide r(s);
    feed(r, client_frame(kClose, ""));
    auto in = r.take(0);
    REQUIRE(in);
    CHECK(in->kind == Incoming::Kind::close);
    CHECK(in->code == 1005);
  }
}

TEST_CASE("read side: a message of 16 KiB waits, one of 16 KiB + 1 fails with 1009") {
  const ConnectionSettings s;
  SECTION("16 KiB") {
    ReadSide r(s);
    feed(r, client_frame(kText, std::string(16 * 1024, 'a')));
    CHECK_FALSE(r.take(0));
    const auto m = r.next_message();
    REQUIRE(m);
    REQUIRE(*m);
    CHECK((*m)->size() == 16 * 1024);
    CHECK(r.readable());
  }
  SECTION("16 KiB + 1, refused from its header alone") {
    ReadSide r(s);
    feed(r, client_frame(kText, std::string(16 * 1024 + 1, 'a')).substr(0, 8));
    auto in = r.take(0);
    REQUIRE(in);
    CHECK(in->kind == Incoming::Kind::failure);
    CHECK(in->code == 1009);
    CHECK(r.failed());
    CHECK_FALSE(r.readable());
    feed(r, client_frame(kText, "later"));
    CHECK_FALSE(r.take(0));
    CHECK_FALSE(r.waiting());
  }
}

TEST_CASE("read side: a text message that is not UTF-8 fails with 1007, valid UTF-8 waits") {
  const ConnectionSettings s;
  ReadSide ok(s);
  feed(ok, client_frame(kText, "caf\xC3\xA9"));
  CHECK_FALSE(ok.take(0));
  CHECK(ok.next_message() == msg("caf\xC3\xA9"));

  ReadSide bad(s);
  feed(bad, client_frame(kText, "ok") + client_frame(kText, "\xC3\x28"));
  auto in = bad.take(0);
  REQUIRE(in);
  CHECK(in->kind == Incoming::Kind::failure);
  CHECK(in->code == 1007);
  CHECK(bad.failed());
  CHECK_FALSE(bad.readable());
  CHECK(bad.next_message() == msg("ok"));
}

TEST_CASE("read side: 24 messages waiting pause reading, 23 do not, and one taken makes room") {
  const ConnectionSettings s;
  REQUIRE(s.max_waiting_messages == 24);
  ReadSide r(s);
  std::string bytes;
  for (int i = 0; i < 25; ++i) bytes += client_frame(kText, "m" + std::to_string(i));
  feed(r, bytes);
  CHECK_FALSE(r.take(0));
  CHECK_FALSE(r.room(0));  // 24 wait: the 25th stays unread
  CHECK(r.next_message() == msg("m0"));
  CHECK(r.room(0));  // 23 wait
  CHECK_FALSE(r.take(0));
  CHECK_FALSE(r.room(0));
  for (int i = 1; i < 25; ++i) {
    CHECK(r.next_message() == msg("m" + std::to_string(i)));
  }
  CHECK_FALSE(r.next_message());
  CHECK(r.room(0));
}

TEST_CASE(
    "read side: read_pause_bytes queued pause reading, one byte less does not, half resumes") {
  const ConnectionSettings s;
  const size_t pause = s.read_pause_bytes;
  REQUIRE(pause == 768 * 1024);
  ReadSide r(s);
  feed(r, client_frame(kText, "m"));
  CHECK_FALSE(r.resume_due(0));  // not paused: nothing to resume
  CHECK_FALSE(r.take(pause));
  CHECK_FALSE(r.waiting());  // the message stays unread while the queue is full
  CHECK_FALSE(r.resume_due(pause / 2 + 1));
  CHECK(r.resume_due(pause / 2));
  CHECK_FALSE(r.resume_due(pause / 2));  // once
  CHECK(r.room(pause - 1));
  CHECK_FALSE(r.take(pause - 1));
  CHECK(r.waiting());
  // Closing: the close handshake is read whatever waits to be sent, messages are discarded.
  r.close();
  feed(r, client_frame(kText, "dropped") + client_frame(kClose, close_body(1000)));
  CHECK(r.room(pause));
  auto in = r.take(pause);
  REQUIRE(in);
  CHECK(in->kind == Incoming::Kind::close);
  CHECK_FALSE(r.waiting());
  CHECK_FALSE(r.resume_due(0));
}

TEST_CASE("read side: early bytes hold the socket unread until fed, and are dropped by a close") {
  const ConnectionSettings s;
  SECTION("served") {
    ReadSide r(s);
    r.hold_early(client_frame(kText, "early"));
    CHECK_FALSE(r.readable());
    CHECK_FALSE(r.take(0));
    CHECK_FALSE(r.waiting());
    REQUIRE(r.feed_early());
    CHECK(r.readable());
    CHECK_FALSE(r.feed_early());
    CHECK_FALSE(r.take(0));
    CHECK(r.next_message() == msg("early"));
  }
  SECTION("closed before being served") {
    ReadSide r(s);
    r.hold_early(client_frame(kText, "early"));
    r.close();
    CHECK(r.readable());
    CHECK_FALSE(r.feed_early());
    CHECK_FALSE(r.take(0));
    CHECK_FALSE(r.waiting());
  }
  SECTION("none") {
    ReadSide r(s);
    r.hold_early("");
    CHECK(r.readable());
    CHECK_FALSE(r.feed_early());
  }
}

namespace {

// Feeds `bytes` in two reads cut at `split`, taking after each as the connection does (acting on
// nothing: the bytes hold no control frame), and returns every message that waits after both.
std::vector<std::optional<std::string>> messages_split_at(const std::string& bytes, size_t split) {
  const ConnectionSettings s;
  ReadSide r(s);
  std::vector<std::optional<std::string>> got;
  auto take_all = [&] {
    for (;;) {
      const auto in = r.take(0);
      REQUIRE_FALSE(in);  // no ping, close or failure in these bytes
      bool any = false;
      while (auto m = r.next_message()) {
        got.push_back(*m);
        any = true;
      }
      if (!any) return;
    }
  };
  r.feed(bytes.data(), split);
  take_all();
  r.feed(bytes.data() + split, bytes.size() - split);
  take_all();
  return got;
}

// A message in fragments of `piece` bytes of text.
std::string fragmented(const std::string& text, size_t piece) {
  std::string frames;
  for (size_t at = 0; at < text.size(); at += piece) {
    frames += client_frame(at == 0 ? kText : kContinuation, text.substr(at, piece),
                           at + piece >= text.size());
  }
  return frames;
}

}  // namespace

// Issue 47: every message that is whole once a read is fed waits after that read, wherever the
// bytes were cut and however many frames one read brings.
TEST_CASE("read side: every split of a fragmented message and of frames back to back") {
  const std::string sub = R"({"type":"sub","id":"w1","channel":"warehouse","scope":{}})";
  SECTION("a message in 2 fragments") {
    const std::string bytes = fragmented(sub, sub.size() / 2 + 1);
    for (size_t split = 0; split <= bytes.size(); ++split) {
      INFO("split at " << split << " of " << bytes.size());
      CHECK(messages_split_at(bytes, split) == std::vector<std::optional<std::string>>{sub});
    }
  }
  SECTION("four messages back to back: fragmented, a NUL byte, binary with a pong inside") {
    const std::string nul(1, '\0');
    // A pong among the fragments of the binary message needs nothing.
    const std::string bytes = fragmented(sub, 7) + client_frame(kText, nul) +
                              client_frame(0x2, "\x01", false) + client_frame(kPong, "x") +
                              client_frame(kContinuation, "\x02", true) + fragmented(sub, 20);
    const std::vector<std::optional<std::string>> want{sub, nul, std::nullopt, sub};
    for (size_t split = 0; split <= bytes.size(); ++split) {
      INFO("split at " << split << " of " << bytes.size());
      CHECK(messages_split_at(bytes, split) == want);
    }
  }
  SECTION("a 16 KiB message in fragments of 64 to 4,096 bytes") {
    std::string big = sub;
    big.insert(1, std::string(ReadSide::kMaxMessageBytes - sub.size(), ' '));
    REQUIRE(big.size() == ReadSide::kMaxMessageBytes);
    for (size_t piece : {64, 256, 1024, 4096}) {
      const std::string bytes = fragmented(big, piece);
      const size_t frame = client_frame(kContinuation, big.substr(0, piece), false).size();
      // Every split within 10 bytes of a frame's start (its header, its first and last bytes),
      // and every 13th byte elsewhere.
      for (size_t split = 0; split <= bytes.size(); ++split) {
        const size_t in_frame = split % frame;
        if (in_frame > 10 && in_frame + 10 < frame && split % 13 != 0) continue;
        INFO("fragments of " << piece << ", split at " << split << " of " << bytes.size());
        const auto got = messages_split_at(bytes, split);
        REQUIRE(got.size() == 1);
        CHECK(got[0] == big);
      }
    }
  }
}
