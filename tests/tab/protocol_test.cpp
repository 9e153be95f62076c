#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tab/protocol.hpp"
#include "ws/limits.hpp"

using namespace outlive::tab;
using namespace outlive::ws;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {
ProtocolError error_of(std::string_view text) {
  auto m = parse_client_message(text);
  REQUIRE(std::holds_alternative<ProtocolError>(m));
  return std::get<ProtocolError>(m);
}
}  // namespace

TEST_CASE("a sub with every field parses") {
  auto m = parse_client_message(
      R"({"type":"sub","id":"w1","channel":"warehouse","scope":{"warehouse":"north"},"cursor":"abc"})");
  REQUIRE(std::holds_alternative<SubMessage>(m));
  const auto& sub = std::get<SubMessage>(m);
  CHECK(sub.id == "w1");
  CHECK(sub.channel == "warehouse");
  CHECK(sub.scope == json{{"warehouse", "north"}});
  CHECK(sub.cursor == "abc");
}

TEST_CASE("a sub without scope or cursor, and an unsub") {
  auto m = parse_client_message(R"({"type":"sub","id":"c","channel":"my_warehouses"})");
  REQUIRE(std::holds_alternative<SubMessage>(m));
  CHECK(std::get<SubMessage>(m).scope == json::object());
  CHECK_FALSE(std::get<SubMessage>(m).cursor);
  auto u = parse_client_message(R"({"type":"unsub","id":"c"})");
  REQUIRE(std::holds_alternative<UnsubMessage>(u));
  CHECK(std::get<UnsubMessage>(u).id == "c");
}

TEST_CASE("ids have 1 to 64 characters") {
  CHECK(std::holds_alternative<UnsubMessage>(
      parse_client_message(json{{"type", "unsub"}, {"id", std::string(64, 'i')}}.dump())));
  CHECK(error_of(json{{"type", "unsub"}, {"id", std::string(65, 'i')}}.dump()).code ==
        "invalid_message");
  CHECK(error_of(R"({"type":"unsub","id":""})").code == "invalid_message");
  CHECK(error_of(R"({"type":"unsub","id":7})").code == "invalid_message");
  CHECK(error_of(R"({"type":"unsub"})").code == "invalid_message");
}

TEST_CASE("malformed messages are invalid_message, naming the id when there is one") {
  CHECK(error_of("not json").code == "invalid_message");
  CHECK(error_of("[1,2]").code == "invalid_message");
  CHECK(error_of(R"({"id":"x"})").id == "x");
  const auto unknown = error_of(R"({"type":"publish","id":"x"})");
  CHECK(unknown.id == "x");
  CHECK_THAT(unknown.message, Catch::Contains("publish"));
  CHECK(error_of(R"({"type":"sub","id":"x"})").id == "x");               // no channel
  CHECK(error_of(R"({"type":"sub","id":"x","channel":""})").id == "x");  // empty channel
  CHECK(error_of(R"({"type":"sub","id":"x","channel":"c","cursor":5})").id == "x");
}

TEST_CASE("an over-long cursor is kept as one from another topic, not an error") {
  auto m = parse_client_message(
      json{{"type", "sub"}, {"id", "x"}, {"channel", "c"}, {"cursor", std::string(65, 'A')}}
          .dump());
  REQUIRE(std::holds_alternative<SubMessage>(m));
  CHECK(std::get<SubMessage>(m).cursor == "");
}

TEST_CASE("a revoked frame carries any id exactly, quotes, escapes and unicode included") {
  for (const std::string& id : std::vector<std::string>{
           "w1", "", "a\"b", "back\\slash", "tab\tnew\nline", std::string("nul\0x", 5), "\x7f",
           "caf\xc3\xa9 \xe2\x9c\x93", "</script>", std::string(64, 'x')}) {
    INFO(json(id).dump());
    const auto frame = json::parse(frames::revoked(id, "access_denied"));
    CHECK(frame == json{{"type", "revoked"}, {"id", id}, {"reason", "access_denied"}});
  }
  // Bytes that are not UTF-8 cannot reach a frame as they are: replaced, never thrown.
  CHECK(json::parse(frames::revoked("bad\xff")) ==
        json{{"type", "revoked"}, {"id", "bad\xef\xbf\xbd"}, {"reason", "access_denied"}});
}

TEST_CASE("frames are the JSON of SPEC 5.3") {
  CHECK(json::parse(frames::subscribed("w1", "C")) ==
        json{{"type", "subscribed"}, {"id", "w1"}, {"cursor", "C"}});
  CHECK(json::parse(frames::resync("w1", "C", "window")) ==
        json{{"type", "resync"}, {"id", "w1"}, {"cursor", "C"}, {"reason", "window"}});
  CHECK(json::parse(frames::revoked("w1")) ==
        json{{"type", "revoked"}, {"id", "w1"}, {"reason", "access_denied"}});
  CHECK(json::parse(frames::progress("C")) == json{{"type", "progress"}, {"cursor", "C"}});
  CHECK(json::parse(frames::error("not_found", "m", std::string("w1"))) ==
        json{{"type", "error"}, {"code", "not_found"}, {"message", "m"}, {"id", "w1"}});
  CHECK_FALSE(json::parse(frames::error("unauthorized", "m")).contains("id"));
  const std::string update =
      frames::update_head({"a", "b"}) + frames::update_tail("K\"1", "C", R"({"x":1})");
  CHECK(json::parse(update) == json{{"type", "update"},
                                    {"ids", {"a", "b"}},
                                    {"key", "K\"1"},
                                    {"cursor", "C"},
                                    {"data", {{"x", 1}}}});
}

TEST_CASE("opens per second: 5 allowed, the 6th refused, allowed again a second later") {
  OpenRateLimiter limiter(5, 1000ms);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) CHECK(limiter.allow("person:ada", t0 + std::chrono::milliseconds(i)));
  CHECK_FALSE(limiter.allow("person:ada", t0 + 10ms));
  CHECK(limiter.allow("person:bob", t0 + 10ms));  // another key is not affected
  CHECK(limiter.allow("person:ada", t0 + 1000ms));
}

TEST_CASE("opens are counted at the time they opened, whatever order their checks finish in") {
  OpenRateLimiter limiter(5, 1000ms);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i : {4, 2, 0, 3, 1}) CHECK(limiter.allow("p", t0 + std::chrono::milliseconds(i * 100)));
  CHECK_FALSE(limiter.allow("p", t0 + 50ms));
  CHECK(limiter.allow("p", t0 + 1500ms));  // the opens at 0 and 100 ms are out of its second
}

TEST_CASE("sockets per viewer: 16 allowed, the 17th refused, room again after one closes") {
  SocketCounter counter(16);
  for (int i = 0; i < 16; ++i) CHECK(counter.try_add("user:ada"));
  CHECK_FALSE(counter.try_add("user:ada"));
  CHECK(counter.try_add("user:ada:read"));
  counter.remove("user:ada");
  CHECK(counter.try_add("user:ada"));
  CHECK(counter.count("user:ada") == 16);
}

namespace {
// A sub whose scope nests objects so that the message has `depth` levels (the message is level 1).
std::string sub_nested(size_t depth, const std::string& tail = "") {
  std::string scope;
  for (size_t i = 2; i <= depth; ++i) scope += R"({"a":)";
  scope += "1";
  for (size_t i = 2; i <= depth; ++i) scope += "}";
  return R"({"type":"sub","id":"deep","channel":"c","scope":)" + scope + tail + "}";
}
}  // namespace

TEST_CASE("a message of 32 levels is read and one of 33 is invalid_message with its id") {
  auto m = parse_client_message(sub_nested(32));
  REQUIRE(std::holds_alternative<SubMessage>(m));
  const json* inner = &std::get<SubMessage>(m).scope;
  size_t levels = 1;
  while (inner->is_object()) {
    inner = &(*inner)["a"];
    ++levels;
  }
  CHECK(levels == 32);

  const auto deep = error_of(sub_nested(33));
  CHECK(deep.code == "invalid_message");
  CHECK(deep.id == "deep");
  CHECK_THAT(deep.message, Catch::Contains("32"));
  // Arrays count as levels too, and an id after the deep part is read as well.
  const std::string arrays = R"({"type":"sub","channel":"c","scope":)" + std::string(32, '[') +
                             std::string(32, ']') + R"(,"id":"late"})";
  CHECK(error_of(arrays).id == "late");
  CHECK(std::holds_alternative<SubMessage>(
      parse_client_message(R"({"type":"sub","channel":"c","scope":)" + std::string(31, '[') +
                           std::string(31, ']') + R"(,"id":"late"})")));
}

TEST_CASE("brackets inside strings are not levels, and a deep message that is not JSON says so") {
  const std::string in_string = R"({"type":"unsub","id":"s","x":")" + std::string(40, '[') +
                                R"(\")" + std::string(40, '{') + R"("})";
  CHECK(std::holds_alternative<UnsubMessage>(parse_client_message(in_string)));
  const auto broken = error_of(std::string(40, '[') + R"({"id":"x")");
  CHECK(broken.code == "invalid_message");
  CHECK_FALSE(broken.id);
  CHECK(error_of(std::string(33, '[') + std::string(33, ']')).message ==
        "a message is a JSON object");
  // The last "id" counts, as in a message of normal depth; an id that is not a string is none.
  CHECK_FALSE(error_of(sub_nested(33, R"(,"id":5)")).id);
  CHECK(error_of(sub_nested(33, R"(,"id":"second")")).id == "second");
  // A message far deeper than any parser stack is refused all the same.
  const auto very_deep =
      error_of(R"({"id":"v","scope":)" + std::string(8000, '[') + std::string(8000, ']') + "}");
  CHECK(very_deep.id == "v");
}

TEST_CASE("a sub's filter keeps its fields and their scalar values") {
  auto m = parse_client_message(
      R"({"type":"sub","id":"w1","channel":"c","filter":{"op":"deleted","qty":3,"ok":true,"note":null}})");
  REQUIRE(std::holds_alternative<SubMessage>(m));
  const auto& filter = std::get<SubMessage>(m).filter;
  REQUIRE(filter);
  CHECK(*filter == Filter{{"note", nullptr}, {"ok", true}, {"op", "deleted"}, {"qty", 3}});
  // Absent, null or empty: no filter, every update.
  for (const char* text : {R"({"type":"sub","id":"w1","channel":"c"})",
                           R"({"type":"sub","id":"w1","channel":"c","filter":null})",
                           R"({"type":"sub","id":"w1","channel":"c","filter":{}})"}) {
    auto plain = parse_client_message(text);
    REQUIRE(std::holds_alternative<SubMessage>(plain));
    CHECK_FALSE(std::get<SubMessage>(plain).filter);
  }
}

TEST_CASE("a filter of exactly 8 fields is accepted and one of 9 refused") {
  json filter = json::object();
  for (int i = 0; i < 8; ++i) filter["f" + std::to_string(i)] = i;
  json sub{{"type", "sub"}, {"id", "w1"}, {"channel", "c"}, {"filter", filter}};
  auto eight = parse_client_message(sub.dump());
  REQUIRE(std::holds_alternative<SubMessage>(eight));
  CHECK(std::get<SubMessage>(eight).filter->size() == kMaxFilterFields);
  sub["filter"]["f8"] = 8;
  const auto nine = error_of(sub.dump());
  CHECK(nine.code == "invalid_message");
  CHECK(nine.id == "w1");
  CHECK_THAT(nine.message, Catch::Contains("at most 8"));
}

TEST_CASE("a filter that is not an object of scalars is invalid_message with the id") {
  for (const char* filter : {R"({"a":{"b":1}})", R"({"a":[1]})", R"({"a":[]})", R"({"a":{}})",
                             R"({"ok":1,"a":{"b":1}})", R"([["a",1]])", R"("a")", "1", "true"}) {
    INFO(filter);
    const auto e =
        error_of(std::string(R"({"type":"sub","id":"w1","channel":"c","filter":)") + filter + "}");
    CHECK(e.code == "invalid_message");
    CHECK(e.id == "w1");
    CHECK_THAT(e.message, Catch::Contains("filter"));
  }
}

TEST_CASE("an auth message carries a token of 1 to 8 KiB (SPEC 5.1 rev 4)") {
  auto m = parse_client_message(R"({"type":"auth","token":"a.b.c"})");
  REQUIRE(std::holds_alternative<AuthMessage>(m));
  CHECK(std::get<AuthMessage>(m).token == "a.b.c");
  CHECK(std::holds_alternative<AuthMessage>(parse_client_message(
      json{{"type", "auth"}, {"token", std::string(kMaxTokenLength, 't')}}.dump())));
  CHECK(error_of(json{{"type", "auth"}, {"token", std::string(kMaxTokenLength + 1, 't')}}.dump())
            .message.find("longer than") != std::string::npos);
  CHECK(error_of(R"({"type":"auth","token":""})").code == "invalid_message");
  CHECK(error_of(R"({"type":"auth"})").code == "invalid_message");
  CHECK(error_of(R"({"type":"auth","token":5})").code == "invalid_message");
  CHECK(json::parse(frames::auth_expiring(30000)) ==
        json{{"type", "auth_expiring"}, {"in_ms", 30000}});
}

TEST_CASE("a NUL byte is not JSON: alone, or behind a whole message") {
  using namespace std::string_literals;
  CHECK(error_of("\0"s).code == "invalid_message");
  CHECK(error_of("\0"s).message == "not JSON");
  // nlohmann's lexer ends the input at a NUL: what precedes it alone would parse.
  const std::string unsub = R"({"type":"unsub","id":"x"})";
  REQUIRE(std::holds_alternative<UnsubMessage>(parse_client_message(unsub)));
  CHECK(error_of(unsub + "\0junk"s).code == "invalid_message");
  CHECK(error_of(unsub + "\0"s).code == "invalid_message");
  // Written as an escape it is a character like any other.
  CHECK(std::holds_alternative<UnsubMessage>(
      parse_client_message(R"({"type":"unsub","id":"x\u0000y"})")));
}
