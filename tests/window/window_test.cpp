// The window on its own: its limits (5,000 updates, 32 MiB) and what they evict, which cursors it
// can replay from, and parsing the three kinds of envelope (SPEC 5.6, 2.1, 2.3).
#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "window/window.hpp"

using namespace outlive::window;

namespace {

UpdatePtr data_update(uint64_t position, size_t data_size = 8, const std::string& key = "k") {
  Update u;
  u.position = position;
  u.key = key;
  u.kind = Kind::data;
  u.data_json = std::make_shared<const std::string>(std::string(data_size, 'x'));
  return std::make_shared<const Update>(std::move(u));
}

std::vector<uint64_t> positions(const std::vector<UpdatePtr>& updates) {
  std::vector<uint64_t> out;
  for (const auto& u : updates) out.push_back(u->position);
  return out;
}

void fill(Window& w, uint64_t from, uint64_t to, size_t data_size = 8) {
  for (uint64_t p = from; p <= to; ++p) w.append(data_update(p, data_size));
}

}  // namespace

TEST_CASE("an empty window is at position 0 and can replay from 0") {
  Window w;
  CHECK(w.head() == 0);
  CHECK(w.oldest_replayable() == 0);
  CHECK(w.size() == 0);
  CHECK(w.bytes() == 0);
  auto all = w.since(0);
  REQUIRE(all);
  CHECK(all->empty());
}

TEST_CASE("5,000 updates all stay and the 5,001st evicts the oldest") {
  Window w;  // default limits: 5,000 updates, 32 MiB
  fill(w, 1, 5000);
  CHECK(w.size() == 5000);
  CHECK(w.head() == 5000);
  CHECK(w.oldest_replayable() == 0);
  REQUIRE(w.since(0));
  CHECK(w.since(0)->size() == 5000);
  CHECK(w.since(0)->front()->position == 1);

  w.append(data_update(5001));
  CHECK(w.size() == 5000);
  CHECK(w.head() == 5001);
  CHECK(w.oldest_replayable() == 1);
  CHECK_FALSE(w.since(0));
  REQUIRE(w.since(1));
  CHECK(w.since(1)->size() == 5000);
  CHECK(w.since(1)->front()->position == 2);
  CHECK(w.since(1)->back()->position == 5001);
}

TEST_CASE("large updates are bounded by 32 MiB, evicting the oldest cursors") {
  Window w;
  const size_t size8k = 8 * 1024;
  fill(w, 1, 8000, size8k);
  const size_t max_bytes = 32u * 1024 * 1024;
  CHECK(w.bytes() <= max_bytes);
  CHECK(w.size() < 5000);                         // the byte bound binds before the count
  CHECK(w.size() * size8k > max_bytes * 9 / 10);  // and it keeps about as many as fit
  CHECK(w.head() == 8000);
  const uint64_t floor = w.oldest_replayable();
  CHECK(floor == 8000 - w.size());
  // The oldest cursors fell out, the newer ones are replayable.
  CHECK_FALSE(w.since(0));
  CHECK_FALSE(w.since(3000));
  CHECK_FALSE(w.since(floor - 1));
  REQUIRE(w.since(floor));
  CHECK(w.since(floor)->size() == w.size());
  CHECK(w.since(floor)->front()->position == floor + 1);
  // The byte count is exactly what the held updates cost.
  size_t sum = 0;
  const auto held = w.since(floor);
  for (const auto& u : *held) sum += u->bytes();
  CHECK(w.bytes() == sum);
}

TEST_CASE("an update costs its key, its data and a fixed overhead") {
  const auto small = data_update(1, 10, "key");
  const auto big = data_update(2, 1010, "key");
  CHECK(big->bytes() - small->bytes() == 1000);
  CHECK(small->bytes() > 13);
  Update access;
  access.key = "key";
  access.kind = Kind::access;
  CHECK(access.bytes() == small->bytes() - 10);
}

TEST_CASE("custom limits evict by count and by bytes") {
  Window by_count(Limits{.max_updates = 3, .max_bytes = 1 << 20});
  fill(by_count, 1, 10);
  CHECK(by_count.size() == 3);
  CHECK(by_count.oldest_replayable() == 7);
  CHECK(positions(*by_count.since(7)) == std::vector<uint64_t>{8, 9, 10});

  const size_t one = data_update(1, 100)->bytes();
  Window by_bytes(Limits{.max_updates = 100, .max_bytes = one * 2 + one / 2});
  fill(by_bytes, 1, 5, 100);
  CHECK(by_bytes.size() == 2);
  CHECK(by_bytes.bytes() == 2 * one);
  CHECK(by_bytes.oldest_replayable() == 3);

  // An update larger than the whole budget leaves the window empty, but at its position.
  by_bytes.append(data_update(6, one * 3));
  CHECK(by_bytes.size() == 0);
  CHECK(by_bytes.bytes() == 0);
  CHECK(by_bytes.head() == 6);
  CHECK(by_bytes.oldest_replayable() == 6);
  CHECK(by_bytes.since(6)->empty());
  CHECK_FALSE(by_bytes.since(5));
}

TEST_CASE("since() inside the window, at its edges and outside") {
  Window w(Limits{.max_updates = 10});
  fill(w, 1, 25);  // holds 16..25, replayable cursors 15..25
  REQUIRE(w.oldest_replayable() == 15);
  REQUIRE(w.head() == 25);

  SECTION("inside") {
    CHECK(positions(*w.since(20)) == std::vector<uint64_t>{21, 22, 23, 24, 25});
    CHECK(positions(*w.since(24)) == std::vector<uint64_t>{25});
  }
  SECTION("at the oldest edge: everything") {
    const auto all = w.since(15);
    REQUIRE(all);
    CHECK(all->size() == 10);
    CHECK(all->front()->position == 16);
  }
  SECTION("at the head: nothing missed") {
    const auto none = w.since(25);
    REQUIRE(none);
    CHECK(none->empty());
  }
  SECTION("older than the window") {
    CHECK_FALSE(w.since(14));
    CHECK_FALSE(w.since(0));
  }
  SECTION("beyond the head is not 'too old' (the caller refuses it as another topic)") {
    const auto beyond = w.since(26);
    REQUIRE(beyond);
    CHECK(beyond->empty());
  }
}

TEST_CASE("positions without an update advance the head and keep cursors replayable") {
  Window w;
  w.append(data_update(1));
  w.advance_to(3);  // 2 and 3 were not updates (skipped or deleted)
  CHECK(w.head() == 3);
  CHECK(w.size() == 1);
  w.append(data_update(4));
  CHECK(positions(*w.since(1)) == std::vector<uint64_t>{4});
  CHECK(positions(*w.since(2)) == std::vector<uint64_t>{4});
  CHECK(positions(*w.since(0)) == std::vector<uint64_t>{1, 4});
  w.advance_to(2);  // never backwards
  CHECK(w.head() == 4);
}

TEST_CASE("a window started later than the topic's first message replays only from there") {
  Window w(Limits{.max_updates = 5});
  w.start_at(1000);
  CHECK(w.head() == 1000);
  CHECK(w.oldest_replayable() == 1000);
  CHECK_FALSE(w.since(999));
  CHECK(w.since(1000)->empty());
  fill(w, 1001, 1003);
  CHECK(positions(*w.since(1000)) == std::vector<uint64_t>{1001, 1002, 1003});
  fill(w, 1004, 1007);
  CHECK(w.oldest_replayable() == 1002);
  // start_at empties it again.
  w.start_at(2000);
  CHECK(w.size() == 0);
  CHECK(w.bytes() == 0);
  CHECK(w.head() == 2000);
  CHECK(w.oldest_replayable() == 2000);
}

TEST_CASE("readers see a consistent window while the reader appends") {
  Window w(Limits{.max_updates = 100});
  std::atomic<bool> done{false};
  std::atomic<int> checks{0};
  std::atomic<int> inconsistent{0};  // no Catch2 assertions off the main thread
  std::atomic<bool> started{false};
  std::thread reader([&] {
    started = true;
    while (!done) {
      const uint64_t floor = w.oldest_replayable();
      if (auto got = w.since(floor)) {
        for (size_t i = 1; i < got->size(); ++i) {
          if ((*got)[i]->position != (*got)[i - 1]->position + 1) inconsistent++;
        }
        if (got->size() > 100 || (!got->empty() && got->front()->position <= floor)) inconsistent++;
      }
      checks++;
    }
  });
  while (!started) std::this_thread::yield();
  fill(w, 1, 20000);
  while (checks == 0) std::this_thread::yield();
  done = true;
  reader.join();
  CHECK(w.size() == 100);
  CHECK(w.oldest_replayable() == 19900);
  CHECK(checks > 0);
  CHECK(inconsistent == 0);
}

TEST_CASE("parse_envelope: a data update, as Postgres writes it") {
  const auto u = parse_envelope(42, R"({"d": {"n": 1, "s": "a b"}, "k": "warehouse-1", "v": 1})",
                                1700000000123456);
  REQUIRE(u);
  CHECK(u->position == 42);
  CHECK(u->key == "warehouse-1");
  CHECK(u->kind == Kind::data);
  CHECK_FALSE(u->access);
  REQUIRE(u->data_json);
  CHECK(*u->data_json == R"({"n":1,"s":"a b"})");  // compact
  CHECK(u->created_at_us == 1700000000123456);
  CHECK(u->bytes() == std::string("warehouse-1").size() + u->data_json->size() + Update{}.bytes());

  const auto scalar = parse_envelope(1, R"({"v":1,"k":"x","d":[1, 2, "three"]})");
  REQUIRE(scalar);
  CHECK(*scalar->data_json == R"([1,2,"three"])");
  CHECK(scalar->created_at_us == 0);
}

TEST_CASE("parse_envelope: an access update") {
  const auto u = parse_envelope(7, R"({"k": "team-9", "v": 1, "access": true})");
  REQUIRE(u);
  CHECK(u->kind == Kind::access);
  CHECK(u->access);
  CHECK(u->key == "team-9");
  CHECK(u->data_json == nullptr);

  const auto with_data =
      parse_envelope(8, R"({"v":1,"k":"team-9","access":true,"d":{"members":2}})");
  REQUIRE(with_data);
  CHECK(with_data->kind == Kind::access);
  REQUIRE(with_data->data_json);
  CHECK(*with_data->data_json == R"({"members":2})");
}

TEST_CASE("parse_envelope: an oversized update becomes a resync") {
  const auto u = parse_envelope(9, R"({"k": "big", "v": 1, "resync": "oversized"})");
  REQUIRE(u);
  CHECK(u->kind == Kind::resync);
  CHECK_FALSE(u->access);
  CHECK(u->key == "big");
  CHECK(u->data_json == nullptr);
}

TEST_CASE("parse_envelope: anything else is not an envelope") {
  for (const char* text : {
           "", "not json", R"({"v":1,"k":"x","d":)", "[1,2,3]", "\"string\"", "null", "{}",
           R"({"k":"x","d":1})",                 // no version
           R"({"v":2,"k":"x","d":1})",           // unknown version
           R"({"v":"1","k":"x","d":1})",         // version not a number
           R"({"v":1,"d":1})",                   // no key
           R"({"v":1,"k":"","d":1})",            // empty key
           R"({"v":1,"k":5,"d":1})",             // key not a string
           R"({"v":1,"k":"x"})",                 // nothing in it
           R"({"v":1,"k":"x","access":false})",  // not an access update, no data
           R"({"v":1,"k":"x","resync":true})",   // resync without a reason
       }) {
    INFO(text);
    CHECK_FALSE(parse_envelope(1, text));
  }
}

TEST_CASE("positions lost from the topic: nothing before them is replayable") {
  Window w;
  for (uint64_t p = 1; p <= 3; ++p) w.append(data_update(p));
  REQUIRE(w.oldest_replayable() == 0);
  w.lose_through(6);  // 4, 5 and 6 were discarded before they were read
  w.append(data_update(7));
  CHECK(w.head() == 7);
  CHECK(w.oldest_replayable() == 6);
  CHECK_FALSE(w.since(3).has_value());
  CHECK_FALSE(w.since(5).has_value());
  CHECK(positions(*w.since(6)) == std::vector<uint64_t>{7});
  // Before any update after them, too: the head moves with them.
  w.lose_through(9);
  CHECK(w.head() == 9);
  CHECK(w.oldest_replayable() == 9);
  CHECK(w.since(9)->empty());
  w.lose_through(8);  // never backwards
  CHECK(w.oldest_replayable() == 9);
}

TEST_CASE("evicting updates from before a loss never moves the oldest replayable back") {
  Window w(Limits{3, 1u << 20});
  w.append(data_update(1));
  w.append(data_update(2));
  w.lose_through(9);
  w.append(data_update(10));
  REQUIRE(w.oldest_replayable() == 9);
  w.append(data_update(11));  // evicts 1
  CHECK(w.oldest_replayable() == 9);
  w.append(data_update(12));
  w.append(data_update(13));  // evicts 2 and 10
  CHECK(w.oldest_replayable() == 10);
}
