// Frames written in the same write as the upgrade request (issue 34): a client that does not wait
// for the 101 (raw and Autobahn-style clients), or a proxy that coalesces, puts its first frames
// in the read that brings the request. The HTTP side reads past the request into its buffer; those
// bytes must reach the socket's frame reader first, under every limit of later bytes, and only
// once the socket is served. Real PostgreSQL and nats-server; plain sockets, since no client
// library writes this way. Every wait has a deadline.
#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/inventory.hpp"
#include "support/raw_ws.hpp"
#include "support/replica_fixture.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSchema = kInventoryTables + kAdaSeed;

const std::string kCookie = "Cookie: " + kAdaCookie + "\r\n";
constexpr size_t kMessageLimit = 16 * 1024;  // SPEC 5.7: a message from the tab

struct Fixture : ReplicaFixture {
  Fixture()
      : ReplicaFixture(kSchema, [](const std::string& db, const std::string& nats) {
          return inventory_replica_config(db, nats, "pipelined", warehouse_channels());
        }) {}

  // The upgrade request and `pipelined` in one write, signed in with the cookie.
  RawWs open(const std::string& pipelined, const std::string& app = "inventory",
             const std::string& headers = kCookie) {
    return RawWs(port, "/api/" + app + "/live", headers, pipelined);
  }
};

std::string sub_text(const std::string& id, size_t padded_to = 0) {
  std::string text =
      json{{"type", "sub"}, {"id", id}, {"channel", "warehouse"}, {"scope", kNorthScope}}.dump();
  // JSON allows whitespace between tokens: a message of any size that is still a valid sub.
  if (padded_to > text.size()) text.insert(1, std::string(padded_to - text.size(), ' '));
  return text;
}

// Every frame the server sends up to and including its close (or until `timeout` passes or the
// connection ends).
std::vector<ServerFrame> frames_until_close(RawWs& ws, std::chrono::milliseconds timeout = 5s) {
  std::vector<ServerFrame> frames;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return frames;
    auto f = ws.next(left);
    if (!f) return frames;
    frames.push_back(*f);
    if (f->opcode == 0x8) return frames;
  }
}

// The next text frame as JSON, skipping pings and progress; nullopt when none comes in time.
std::optional<json> next_answer(RawWs& ws, std::chrono::milliseconds timeout = 3s) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    auto f = ws.next(left);
    if (!f || f->opcode == 0x8) return std::nullopt;
    if (f->opcode != 0x1) continue;
    auto j = json::parse(f->payload, nullptr, false);
    if (!j.is_discarded() && j.value("type", "") != "progress") return j;
  }
}

std::string describe(const std::vector<ServerFrame>& frames) {
  std::string text;
  for (const auto& f : frames) {
    text += "[opcode " + std::to_string(f.opcode) + "] ";
    text += f.opcode == 0x8 ? std::to_string(f.close_code()) : f.payload.substr(0, 120);
    text += "\n";
  }
  return text;
}

}  // namespace

TEST_CASE("a sub in the same write as the upgrade request is answered") {
  Fixture f;
  auto ws = f.open(client_frame(0x1, sub_text("w1")));
  auto answer = next_answer(ws);
  REQUIRE(answer);
  CHECK((*answer)["type"] == "subscribed");
  CHECK((*answer)["id"] == "w1");
}

TEST_CASE("a sub whose first fragment shares the write of the upgrade request is answered") {
  Fixture f;
  const std::string text = sub_text("w1");
  const size_t third = text.size() / 3;
  auto ws = f.open(client_frame(0x1, text.substr(0, third), false));
  // The rest after the 101, as two more fragments written apart.
  ws.send_in_pieces(client_frame(0x0, text.substr(third, third), false), 1 << 20, 20ms);
  ws.send_in_pieces(client_frame(0x0, text.substr(2 * third), true), 1 << 20, 0us);
  auto answer = next_answer(ws);
  REQUIRE(answer);
  CHECK((*answer)["type"] == "subscribed");
  CHECK((*answer)["id"] == "w1");
}

TEST_CASE("three short invalid messages in the write of the upgrade request get three answers") {
  Fixture f;
  // DEL, U+FFFE (a noncharacter) and U+D7FF: valid UTF-8, not JSON (SPEC 5.2: invalid_message).
  const std::string texts[] = {"\x7f", "\xef\xbf\xbe", "\xed\x9f\xbf"};
  std::string all;
  for (const auto& t : texts) all += client_frame(0x1, t);
  auto ws = f.open(all);
  for (int i = 0; i < 3; ++i) {
    INFO("answer " << i);
    auto e = next_answer(ws);
    REQUIRE(e);
    CHECK((*e)["type"] == "error");
    CHECK((*e)["code"] == "invalid_message");
  }
  // The socket stays.
  ws.send_raw(client_frame(0x1, sub_text("after")));
  auto s = next_answer(ws);
  REQUIRE(s);
  CHECK((*s)["type"] == "subscribed");
  CHECK((*s)["id"] == "after");
}

TEST_CASE(
    "thirty messages in the write of the upgrade request, past the 24 that may wait, all "
    "answered") {
  Fixture f;
  // More than the inbox holds (SPEC 5.7: 24), and more than the HTTP side's first read: the rest
  // waits in the frame reader and the socket, and is answered after, in order.
  std::string all;
  for (int i = 0; i < 30; ++i) {
    all += client_frame(0x1, json{{"type", "nope"}, {"id", "m" + std::to_string(i)}}.dump());
  }
  auto ws = f.open(all);
  for (int i = 0; i < 30; ++i) {
    INFO("answer " << i);
    auto e = next_answer(ws);
    REQUIRE(e);
    CHECK((*e)["code"] == "invalid_message");
    CHECK((*e)["id"] == "m" + std::to_string(i));
  }
}

TEST_CASE(
    "a sub of exactly 16 KiB in the write of the upgrade request, then nothing, is answered") {
  Fixture f;
  const std::string text = sub_text("big", kMessageLimit);
  REQUIRE(text.size() == kMessageLimit);
  // Larger than the HTTP side's first read: part of the frame comes with the request, the rest
  // from the socket after it.
  auto ws = f.open(client_frame(0x1, text));
  auto answer = next_answer(ws);
  REQUIRE(answer);
  CHECK((*answer)["type"] == "subscribed");
  CHECK((*answer)["id"] == "big");
}

TEST_CASE(
    "a message over 16 KiB in the write of the upgrade request closes 1009, nothing answered") {
  Fixture f;
  const std::string text = sub_text("big", kMessageLimit + 1);
  // A sub behind it: nothing after the frame that broke the limit is read.
  auto ws = f.open(client_frame(0x1, text) + client_frame(0x1, sub_text("after")));
  const auto frames = frames_until_close(ws);
  INFO(describe(frames));
  REQUIRE(!frames.empty());
  CHECK(frames.size() == 1);
  CHECK(frames.back().opcode == 0x8);
  CHECK(frames.back().close_code() == 1009);
}

TEST_CASE("bytes behind the upgrade request are parsed only once the socket is served") {
  Fixture f;
  // A ping (answered by the transport itself, before any check) and a frame over the limit
  // (1009 as soon as its header is read): either shows that the bytes were parsed.
  const std::string ping = client_frame(0x9, "early");
  const std::string too_big = client_frame(0x1, std::string(kMessageLimit + 1, 'a'));

  SECTION("served: the ping is answered and the sub behind it too") {
    auto ws = f.open(ping + client_frame(0x1, sub_text("w1")));
    auto pong = ws.next(3s);
    REQUIRE(pong);
    CHECK(pong->opcode == 0xA);
    CHECK(pong->payload == "early");
    auto answer = next_answer(ws);
    REQUIRE(answer);
    CHECK((*answer)["type"] == "subscribed");
  }
  SECTION("an unknown app: its error and 1008, nothing else") {
    auto ws = f.open(ping + client_frame(0x1, sub_text("w1")) + too_big, "nosuchapp");
    const auto frames = frames_until_close(ws);
    INFO(describe(frames));
    REQUIRE(frames.size() == 2);
    CHECK(frames[0].opcode == 0x1);
    CHECK(json::parse(frames[0].payload)["code"] == "unknown_app");
    CHECK(frames[1].opcode == 0x8);
    CHECK(frames[1].close_code() == 1008);
  }
  SECTION("an unknown credential: its error and 1008, nothing else") {
    auto ws = f.open(ping + client_frame(0x1, sub_text("w1")) + too_big, "inventory",
                     "Authorization: Bearer no-such-key\r\n");
    const auto frames = frames_until_close(ws);
    INFO(describe(frames));
    REQUIRE(frames.size() == 2);
    CHECK(frames[0].opcode == 0x1);
    CHECK(json::parse(frames[0].payload)["code"] == "unauthorized");
    CHECK(frames[1].opcode == 0x8);
    CHECK(frames[1].close_code() == 1008);
  }
}

// Issue 47: an RFC 6455 conformance run wrote these shapes in one write once the 101 had come and
// reported no answer. Not reproduced here (nor at the frame reader's every split, read_side_test):
// these pin the answers, in one write after the 101, while reading is paused on a full inbox, and
// while the socket is not read because bytes of the upgrade's own write wait for the credential.
namespace {

struct Shape {
  std::string name;
  std::string bytes;
  std::string type;  // the answer expected
  std::string code;  // an error's code
};

// A message in fragments of `piece` bytes of text.
std::string fragmented(const std::string& text, size_t piece) {
  std::string frames;
  for (size_t at = 0; at < text.size(); at += piece) {
    frames += client_frame(at == 0 ? 0x1 : 0x0, text.substr(at, piece), at + piece >= text.size());
  }
  return frames;
}

std::vector<Shape> conformance_shapes() {
  std::vector<Shape> shapes;
  const std::string sub = sub_text("split");
  shapes.push_back({"a sub in 2 fragments", fragmented(sub, sub.size() / 2 + 1), "subscribed", ""});
  for (size_t piece : {64, 256, 1024, 4096}) {
    shapes.push_back({"a 16 KiB sub in fragments of " + std::to_string(piece),
                      fragmented(sub_text("big", kMessageLimit), piece), "subscribed", ""});
  }
  shapes.push_back({"a text message of one NUL byte", client_frame(0x1, std::string(1, '\0')),
                    "error", "invalid_message"});
  return shapes;
}

// Ada may open 5 sockets a second (admission): the shapes, one socket each, are paced below that.
void pace_opens() { std::this_thread::sleep_for(250ms); }

void check_answer(RawWs& ws, const Shape& shape) {
  auto answer = next_answer(ws);
  REQUIRE(answer);
  CHECK((*answer)["type"] == shape.type);
  if (!shape.code.empty()) CHECK((*answer)["code"] == shape.code);
  // The socket stays: a sub behind it is answered.
  ws.send_raw(client_frame(0x1, sub_text("after")));
  auto after = next_answer(ws);
  REQUIRE(after);
  CHECK((*after)["type"] == "subscribed");
  CHECK((*after)["id"] == "after");
}

}  // namespace

TEST_CASE("one write after the 101: fragmented subs and a NUL byte message are answered") {
  Fixture f;
  for (const auto& shape : conformance_shapes()) {
    INFO(shape.name);
    pace_opens();
    RawWs ws(f.port, "/api/inventory/live", kCookie);
    ws.send_raw(shape.bytes);
    check_answer(ws, shape);
  }
}

TEST_CASE("one write while reading pauses on a full inbox is read when reading resumes") {
  Fixture f;
  for (const auto& shape : conformance_shapes()) {
    INFO(shape.name);
    pace_opens();
    RawWs ws(f.port, "/api/inventory/live", kCookie);
    // 12 subs (each checked in turn, off the io thread) and 18 short invalid messages: 24 wait,
    // the socket is not read until they are down to fewer with nothing left in the frame reader.
    std::string first;
    for (int i = 0; i < 12; ++i) first += client_frame(0x1, sub_text("s" + std::to_string(i)));
    for (int i = 0; i < 18; ++i) {
      first += client_frame(0x1, json{{"type", "nope"}, {"id", "m" + std::to_string(i)}}.dump());
    }
    ws.send_raw(first);
    auto s0 = next_answer(ws);
    REQUIRE(s0);
    REQUIRE((*s0)["id"] == "s0");
    // Written while the other 11 subs are checked: reading is paused.
    ws.send_raw(shape.bytes);
    for (int i = 1; i < 30; ++i) {
      INFO("answer " << i);
      auto a = next_answer(ws);
      REQUIRE(a);
      CHECK((*a)["id"] == (i < 12 ? "s" + std::to_string(i) : "m" + std::to_string(i - 12)));
    }
    check_answer(ws, shape);
  }
}

TEST_CASE("one write after the 101 while the bytes of the upgrade's write wait is answered") {
  Fixture f;
  for (const auto& shape : conformance_shapes()) {
    INFO(shape.name);
    pace_opens();
    // The socket is not read while the credential is looked up (its early bytes go first).
    auto ws = f.open(client_frame(0x1, sub_text("early")));
    ws.send_raw(shape.bytes);
    auto early = next_answer(ws);
    REQUIRE(early);
    CHECK((*early)["id"] == "early");
    check_answer(ws, shape);
  }
}
