#include <catch2/catch.hpp>

#include "topic/cursor.hpp"

using outlive::topic::Cursor;
using outlive::topic::TopicIdentity;

TEST_CASE("a cursor round-trips through its text form") {
  const TopicIdentity topic{"inventory", 1732900000123456789};
  for (uint64_t position : {0ull, 1ull, 5000ull, 18446744073709551615ull}) {
    const std::string text = Cursor::at(topic, position).encode();
    CHECK(text.size() <= outlive::topic::kMaxCursorLength);
    for (char c : text)
      CHECK((std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'));
    const auto decoded = Cursor::decode(text);
    REQUIRE(decoded);
    CHECK(decoded->position == position);
    CHECK(decoded->belongs_to(topic));
  }
}

TEST_CASE("a cursor of another app or another stream instance is from another topic") {
  const TopicIdentity topic{"inventory", 100};
  const auto c = Cursor::decode(Cursor::at(topic, 42).encode());
  REQUIRE(c);
  CHECK_FALSE(c->belongs_to(TopicIdentity{"contacts", 100}));
  CHECK_FALSE(c->belongs_to(TopicIdentity{"inventory", 101}));
}

TEST_CASE("malformed cursors do not decode") {
  const std::string good = Cursor::at(TopicIdentity{"inventory", 7}, 9).encode();
  CHECK_FALSE(Cursor::decode(""));
  CHECK_FALSE(Cursor::decode("not a cursor"));
  CHECK_FALSE(Cursor::decode(good.substr(1)));
  CHECK_FALSE(Cursor::decode(good + "A"));
  CHECK_FALSE(Cursor::decode(std::string(65, 'A')));
  std::string flipped = good;
  flipped[10] = flipped[10] == 'A' ? 'B' : 'A';  // the check catches a changed character
  CHECK_FALSE(Cursor::decode(flipped));
  std::string bad_char = good;
  bad_char[3] = '+';
  CHECK_FALSE(Cursor::decode(bad_char));
}
