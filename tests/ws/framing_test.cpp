// Websocket framing without Beast (src/ws/framing): server frame headers, close payloads, UTF-8,
// and the reader that assembles a tab's masked frames. Hermetic.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "support/raw_ws.hpp"
#include "tab/protocol.hpp"
#include "ws/framing.hpp"

using namespace outlive::ws;
using outlive::tab::kMaxMessageBytes;
using outlive::testing::client_frame;

namespace {

std::vector<Incoming> read_all(FrameReader& reader, const std::string& bytes) {
  reader.feed(bytes.data(), bytes.size());
  std::vector<Incoming> out;
  while (auto in = reader.next()) out.push_back(std::move(*in));
  return out;
}

}  // namespace

TEST_CASE("server frame headers use the shortest length form") {
  auto h = frame_header(Opcode::text, 0);
  REQUIRE(h.size == 2);
  CHECK(h.bytes[0] == 0x81);
  CHECK(h.bytes[1] == 0);
  CHECK(frame_header(Opcode::text, 125).size == 2);
  CHECK(frame_header(Opcode::text, 125).bytes[1] == 125);
  h = frame_header(Opcode::text, 126);
  REQUIRE(h.size == 4);
  CHECK(h.bytes[1] == 126);
  CHECK(((h.bytes[2] << 8) | h.bytes[3]) == 126);
  h = frame_header(Opcode::text, 65535);
  REQUIRE(h.size == 4);
  CHECK(((h.bytes[2] << 8) | h.bytes[3]) == 65535);
  h = frame_header(Opcode::close, 65536);
  REQUIRE(h.size == 10);
  CHECK(h.bytes[0] == 0x88);
  CHECK(h.bytes[1] == 127);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n = (n << 8) | h.bytes[2 + i];
  CHECK(n == 65536);
}

TEST_CASE("a close payload carries the code and a reason cut at a character boundary") {
  const auto p = close_payload(1013, "slow reader");
  REQUIRE(p.size() == 2 + 11);
  CHECK(static_cast<uint8_t>(p[0]) == 0x03);
  CHECK(static_cast<uint8_t>(p[1]) == 0xF5);
  CHECK(p.substr(2) == "slow reader");
  std::string long_reason;
  for (int i = 0; i < 100; ++i) long_reason += "\xC3\xA9";  // é, 2 bytes each
  const auto cut = close_payload(1008, long_reason);
  CHECK(cut.size() <= 125);
  CHECK(cut.size() >= 120);
  CHECK(valid_utf8(cut.substr(2)));
}

TEST_CASE("UTF-8 validation accepts text and refuses malformed sequences") {
  CHECK(valid_utf8(""));
  CHECK(valid_utf8("plain ascii"));
  CHECK(valid_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));  // é € 😀
  CHECK(valid_utf8("\xF4\x8F\xBF\xBF"));                           // U+10FFFF
  CHECK_FALSE(valid_utf8("\x80"));                                 // a lone continuation
  CHECK_FALSE(valid_utf8("\xC0\x80"));                             // overlong NUL
  CHECK_FALSE(valid_utf8("\xE0\x80\x80"));                         // overlong
  CHECK_FALSE(valid_utf8("\xED\xA0\x80"));                         // a surrogate
  CHECK_FALSE(valid_utf8("\xF4\x90\x80\x80"));                     // past U+10FFFF
  CHECK_FALSE(valid_utf8("\xE2\x82"));                             // cut short
  CHECK_FALSE(valid_utf8("\xC3\x28"));                             // bad continuation
}

TEST_CASE("the reader unmasks a text message, also when bytes arrive one at a time") {
  const std::string msg = R"({"type":"sub","id":"s1","channel":"item"})";
  FrameReader whole(kMaxMessageBytes);
  auto got = read_all(whole, client_frame(0x1, msg));
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == Incoming::Kind::text);
  CHECK(got[0].payload == msg);

  FrameReader trickle(kMaxMessageBytes);
  const auto bytes = client_frame(0x1, msg) + client_frame(0x2, "bin");
  std::vector<Incoming> events;
  for (char c : bytes) {
    trickle.feed(&c, 1);
    while (auto in = trickle.next()) events.push_back(std::move(*in));
  }
  REQUIRE(events.size() == 2);
  CHECK(events[0].payload == msg);
  CHECK(events[1].kind == Incoming::Kind::binary);
  CHECK(events[1].payload == "bin");
  CHECK(trickle.buffered() == 0);
}

TEST_CASE("fragments are joined and control frames between them come first") {
  FrameReader reader(kMaxMessageBytes);
  const auto bytes = client_frame(0x1, "hel", false) + client_frame(0x9, "are you there") +
                     client_frame(0x0, "lo ", false) + client_frame(0xA, "") +
                     client_frame(0x0, "world", true);
  auto got = read_all(reader, bytes);
  REQUIRE(got.size() == 3);
  CHECK(got[0].kind == Incoming::Kind::ping);
  CHECK(got[0].payload == "are you there");
  CHECK(got[1].kind == Incoming::Kind::pong);
  CHECK(got[2].kind == Incoming::Kind::text);
  CHECK(got[2].payload == "hello world");
}

TEST_CASE("a message of 16 KiB is read and one byte more is refused with 1009") {
  FrameReader at_limit(kMaxMessageBytes);
  auto got = read_all(at_limit, client_frame(0x1, std::string(kMaxMessageBytes, 'a')));
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == Incoming::Kind::text);
  CHECK(got[0].payload.size() == kMaxMessageBytes);

  // Refused from the header alone: the 16 KiB + 1 payload need not arrive.
  FrameReader over(kMaxMessageBytes);
  const auto frame = client_frame(0x1, std::string(kMaxMessageBytes + 1, 'a'));
  got = read_all(over, frame.substr(0, 8));
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == Incoming::Kind::failure);
  CHECK(got[0].code == 1009);

  // The same limit over fragments.
  FrameReader fragments(kMaxMessageBytes);
  got = read_all(fragments, client_frame(0x1, std::string(kMaxMessageBytes - 10, 'a'), false) +
                                client_frame(0x0, std::string(11, 'b'), true));
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == Incoming::Kind::failure);
  CHECK(got[0].code == 1009);
  CHECK_FALSE(fragments.next());  // nothing after a failure
  // What arrives after a failure is not kept.
  const std::string more = client_frame(0x1, std::string(1000, 'x'));
  fragments.feed(more.data(), more.size());
  CHECK(fragments.buffered() == 0);
  CHECK_FALSE(fragments.next());
}

TEST_CASE("a length not in its shortest form is refused with 1002") {
  // 5 bytes announced in the 16-bit form, and 200 bytes in the 64-bit form.
  std::string short16 = client_frame(0x1, "hello");
  short16.replace(1, 1, std::string{static_cast<char>(0x80 | 126), 0, 5});
  std::string short64 = client_frame(0x1, std::string(200, 'a'));
  short64.replace(
      1, 3,
      std::string{static_cast<char>(0x80 | 127), 0, 0, 0, 0, 0, 0, 0, static_cast<char>(200)});
  for (const auto& bytes : {short16, short64}) {
    FrameReader reader(kMaxMessageBytes);
    auto got = read_all(reader, bytes);
    REQUIRE(got.size() == 1);
    CHECK(got[0].kind == Incoming::Kind::failure);
    CHECK(got[0].code == 1002);
  }
}

TEST_CASE("close frames give the peer's code or 1005") {
  FrameReader reader(kMaxMessageBytes);
  auto got = read_all(reader, client_frame(0x8, close_payload(1000, "bye")));
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == Incoming::Kind::close);
  CHECK(got[0].code == 1000);
  CHECK(got[0].payload == "bye");
  FrameReader empty(kMaxMessageBytes);
  got = read_all(empty, client_frame(0x8, ""));
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == Incoming::Kind::close);
  CHECK(got[0].code == 1005);
}

TEST_CASE("protocol violations are refused with 1002 or 1007") {
  struct Case {
    const char* what;
    std::string bytes;
    uint16_t code;
  };
  const std::vector<Case> cases{
      {"unmasked", client_frame(0x1, "x", true, false), 1002},
      {"reserved bits", client_frame(0x1, "x", true, true, 0x40), 1002},
      {"unknown data opcode", client_frame(0x3, "x"), 1002},
      {"unknown control opcode", client_frame(0xB, "x"), 1002},
      {"fragmented control", client_frame(0x9, "x", false), 1002},
      {"control over 125 bytes", client_frame(0x9, std::string(126, 'p')), 1002},
      {"continuation first", client_frame(0x0, "x"), 1002},
      {"new message inside one", client_frame(0x1, "a", false) + client_frame(0x1, "b"), 1002},
      {"close with one byte", client_frame(0x8, "\x03"), 1002},
      {"close with code 999", client_frame(0x8, close_payload(999, "")), 1002},
      {"text not UTF-8", client_frame(0x1, "\xC0\x80"), 1007},
      {"close reason not UTF-8", client_frame(0x8, close_payload(1000, "\xFF")), 1007},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    FrameReader reader(kMaxMessageBytes);
    auto got = read_all(reader, c.bytes);
    REQUIRE(got.size() == 1);
    CHECK(got[0].kind == Incoming::Kind::failure);
    CHECK(got[0].code == c.code);
  }
  // A binary message need not be UTF-8; a 64-bit length form under the limit is read.
  FrameReader reader(70000);
  auto got =
      read_all(reader, client_frame(0x2, "\xC0\x80") + client_frame(0x1, std::string(66000, 'z')));
  REQUIRE(got.size() == 2);
  CHECK(got[0].kind == Incoming::Kind::binary);
  CHECK(got[1].payload.size() == 66000);
}

TEST_CASE("a text message is refused with 1007 at the fragment that holds the invalid byte") {
  // F4 90 would be past U+10FFFF: refused once the second fragment is in, before the third.
  FrameReader reader(kMaxMessageBytes);
  CHECK(read_all(reader, client_frame(0x1, "ab", false)).empty());
  auto got = read_all(reader, client_frame(0x0, "c\xF4\x90", false));
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == Incoming::Kind::failure);
  CHECK(got[0].code == 1007);
  CHECK(read_all(reader, client_frame(0x0, "\x80\x80", true)).empty());
}

TEST_CASE("a character split between fragments is accepted") {
  // 😀 = F0 9F 98 80, one byte in the first fragment, two in the second, one in the third.
  FrameReader reader(kMaxMessageBytes);
  CHECK(read_all(reader, client_frame(0x1, "a\xF0", false)).empty());
  CHECK(read_all(reader, client_frame(0x0, "\x9F\x98", false)).empty());
  auto got = read_all(reader, client_frame(0x0, "\x80z", true));
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == Incoming::Kind::text);
  CHECK(got[0].payload == "a\xF0\x9F\x98\x80z");
  // A control frame between the halves changes nothing.
  FrameReader with_ping(kMaxMessageBytes);
  got = read_all(with_ping, client_frame(0x1, "\xC3", false) + client_frame(0x9, "p") +
                                client_frame(0x0, "\xA9", true));
  REQUIRE(got.size() == 2);
  CHECK(got[0].kind == Incoming::Kind::ping);
  CHECK(got[1].kind == Incoming::Kind::text);
  CHECK(got[1].payload == "\xC3\xA9");
}

TEST_CASE("an overlong form or a surrogate split between fragments is refused where it shows") {
  struct Case {
    const char* what;
    std::string first;
    std::string second;
  };
  const std::vector<Case> cases{
      {"overlong 3-byte", "\xE0", "\x80\x80"},
      {"overlong 4-byte", "x\xF0", "\x8F\xBF\xBF"},
      {"surrogate", "\xED", "\xA0\x80"},
      {"past U+10FFFF", "\xF4", "\x90\x80\x80"},
      {"lead without its continuation", "\xE2\x82", "("},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    FrameReader reader(kMaxMessageBytes);
    CHECK(read_all(reader, client_frame(0x1, c.first, false)).empty());
    auto got = read_all(reader, client_frame(0x0, c.second, false));
    REQUIRE(got.size() == 1);
    CHECK(got[0].kind == Incoming::Kind::failure);
    CHECK(got[0].code == 1007);
  }
}

TEST_CASE("a text message that ends inside a character is refused with 1007") {
  FrameReader reader(kMaxMessageBytes);
  CHECK(read_all(reader, client_frame(0x1, "ok \xE2\x82", false)).empty());
  auto got = read_all(reader, client_frame(0x0, "", true));
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == Incoming::Kind::failure);
  CHECK(got[0].code == 1007);
  // The next message starts afresh: a cut character does not carry over a finished message.
  FrameReader binary_first(kMaxMessageBytes);
  got =
      read_all(binary_first, client_frame(0x2, "\xE2\x82", true) + client_frame(0x1, "\xAC", true));
  REQUIRE(got.size() == 2);
  CHECK(got[0].kind == Incoming::Kind::binary);
  CHECK(got[1].kind == Incoming::Kind::failure);
  CHECK(got[1].code == 1007);
}

TEST_CASE("the incremental UTF-8 check agrees with the whole-text one") {
  const std::vector<std::string> texts{
      "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80",
      "\xF4\x8F\xBF\xBF",
      "\xC0\x80",
      "\xE0\x80\x80",
      "\xED\x9F\xBF",
      "\xED\xA0\x80",
      "\xF0\x90\x80\x80",
      "\xF4\x90\x80\x80",
      "\xE2\x82",
      "\xC3\x28",
      "\xFF",
      "\x80",
  };
  for (const auto& text : texts) {
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      INFO(cut);
      Utf8Validator v;
      const bool fed = v.feed(text.substr(0, cut)) && v.feed(text.substr(cut));
      CHECK((fed && v.complete()) == valid_utf8(text));
    }
  }
}

TEST_CASE("a text frame is refused with 1007 when its invalid byte arrives, before the frame ends") {
  std::string payload(16000, 'a');
  payload[10] = '\xFF';
  const std::string frame = client_frame(0x1, payload);
  FrameReader reader(kMaxMessageBytes);
  CHECK(read_all(reader, frame.substr(0, 8 + 10)).empty());  // header and mask, 10 good bytes
  auto got = read_all(reader, frame.substr(18, 1));          // the 11th byte
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == Incoming::Kind::failure);
  CHECK(got[0].code == 1007);
}

TEST_CASE("a valid text frame checked piece by piece as it arrives is delivered once whole") {
  // Every split point of a frame with multi-byte characters: each piece is checked as it comes
  // and nothing is checked twice (a character split between reads stays valid).
  const std::string text = "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80 end";
  const std::string frame = client_frame(0x1, text);
  for (size_t cut = 1; cut < frame.size(); ++cut) {
    FrameReader reader(kMaxMessageBytes);
    CHECK(read_all(reader, frame.substr(0, cut)).empty());
    auto got = read_all(reader, frame.substr(cut));
    REQUIRE(got.size() == 1);
    CHECK(got[0].kind == Incoming::Kind::text);
    CHECK(got[0].payload == text);
  }
  // The same message in two fragments, each fed a byte at a time.
  const std::string fragments =
      client_frame(0x1, text.substr(0, 9), false) + client_frame(0x0, text.substr(9), true);
  FrameReader reader(kMaxMessageBytes);
  std::vector<Incoming> got;
  for (char c : fragments) {
    auto some = read_all(reader, std::string(1, c));
    for (auto& in : some) got.push_back(std::move(in));
  }
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == Incoming::Kind::text);
  CHECK(got[0].payload == text);
}

TEST_CASE("an invalid byte is refused with 1007 wherever the frame is split around it") {
  // Whole frames are checked once unmasked, partial ones as their bytes arrive: every split point
  // finds the byte exactly once, before or after it, never delivering the message.
  const std::string text = "ab\xC3\xA9 \xFF cd";
  const std::string frame = client_frame(0x1, text);
  for (size_t cut = 0; cut <= frame.size(); ++cut) {
    INFO(cut);
    FrameReader reader(kMaxMessageBytes);
    auto got = read_all(reader, frame.substr(0, cut));
    for (auto& in : read_all(reader, frame.substr(cut))) got.push_back(std::move(in));
    REQUIRE(got.size() == 1);
    CHECK(got[0].kind == Incoming::Kind::failure);
    CHECK(got[0].code == 1007);
  }
}
