// The authorize() batches of one update (fanout/authorize_batches.hpp): distinct viewers per
// channel, at most the batch size each, sent as soon as full, each answering only its decisions.
// Hermetic.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fanout/authorize_batches.hpp"

using namespace outlive::fanout;

namespace {

const std::string kTodo = "todo";
const std::string kBoard = "board";

Viewer viewer(int i) {
  return Viewer{"u" + std::to_string(i), nlohmann::json{{"id", "u" + std::to_string(i)}}.dump()};
}

struct Sent {
  uint32_t index;
  AuthorizeBatch batch;
};

struct Harness {
  std::vector<std::vector<AskedDecision>> asked;
  std::vector<Sent> sent;
  AuthorizeBatches batches;
  explicit Harness(size_t batch_size)
      : batches(batch_size, 16, asked, [this](uint32_t n, AuthorizeBatch&& b) {
          sent.push_back(Sent{n, std::move(b)});
        }) {}
};

}  // namespace

TEST_CASE("authorize batches: 500 distinct viewers fill one batch, 501 make two") {
  for (int viewers : {499, 500, 501, 1000}) {
    Harness h(500);
    std::vector<Viewer> vs;
    for (int i = 0; i < viewers; ++i) vs.push_back(viewer(i));
    for (int i = 0; i < viewers; ++i) h.batches.add({uint32_t(i), 0}, &kTodo, vs[i]);
    h.batches.finish();
    const size_t expected = viewers <= 500 ? 1 : 2;
    REQUIRE(h.sent.size() == expected);
    REQUIRE(h.asked.size() == expected);
    size_t total = 0;
    for (const auto& s : h.sent) {
      CHECK(s.batch.channel == &kTodo);
      CHECK(s.batch.ids.size() <= 500);
      const auto json = nlohmann::json::parse(s.batch.viewers);
      REQUIRE(json.is_array());
      REQUIRE(json.size() == s.batch.ids.size());
      for (size_t i = 0; i < json.size(); ++i) CHECK(json[i]["id"] == s.batch.ids[i]);
      CHECK(h.asked[s.index].size() == s.batch.ids.size());
      total += s.batch.ids.size();
    }
    CHECK(total == size_t(viewers));
  }
}

TEST_CASE("authorize batches: a full batch goes before the next viewer is added, not at finish") {
  Harness h(2);
  std::vector<Viewer> vs{viewer(0), viewer(1), viewer(2)};
  h.batches.add({0, 0}, &kTodo, vs[0]);
  h.batches.add({1, 0}, &kTodo, vs[1]);
  CHECK(h.sent.empty());  // full, but a tab of these viewers may still join it
  h.batches.add({2, 0}, &kTodo, vs[2]);
  REQUIRE(h.sent.size() == 1);
  CHECK(h.sent[0].batch.ids == std::vector<std::string>{"u0", "u1"});
  h.batches.finish();
  REQUIRE(h.sent.size() == 2);
  CHECK(h.sent[1].batch.ids == std::vector<std::string>{"u2"});
}

TEST_CASE(
    "authorize batches: a viewer's second tab is asked once and answered by the same batch, "
    "even after that batch went") {
  Harness h(1);
  const Viewer ada = viewer(0), bob = viewer(1);
  h.batches.add({0, 0}, &kTodo, ada);
  h.batches.add({1, 0}, &kTodo, bob);  // batch 0 (ada) goes
  REQUIRE(h.sent.size() == 1);
  h.batches.add({2, 0}, &kTodo, ada);  // ada's other tab
  h.batches.finish();
  REQUIRE(h.sent.size() == 2);
  CHECK(h.sent[0].batch.ids == std::vector<std::string>{"u0"});
  CHECK(h.sent[1].batch.ids == std::vector<std::string>{"u1"});
  REQUIRE(h.asked.size() == 2);
  REQUIRE(h.asked[0].size() == 2);
  CHECK(h.asked[0][0].follower == 0);
  CHECK(h.asked[0][1].follower == 2);
  REQUIRE(h.asked[1].size() == 1);
  CHECK(h.asked[1][0].follower == 1);
}

TEST_CASE("authorize batches: each channel has batches of its own, naming the follower's channel") {
  Harness h(500);
  const Viewer ada = viewer(0);
  h.batches.add({0, 0}, &kTodo, ada);
  h.batches.add({0, 1}, &kBoard, ada);  // the same follower through its second channel
  h.batches.finish();
  REQUIRE(h.sent.size() == 2);
  CHECK(h.sent[0].batch.channel == &kTodo);
  CHECK(h.sent[1].batch.channel == &kBoard);
  REQUIRE(h.asked[h.sent[1].index].size() == 1);
  CHECK(h.asked[h.sent[1].index][0].channel == 1);
}

TEST_CASE("authorize batches: nothing missing sends nothing, a batch size of 0 counts as 1") {
  {
    Harness h(500);
    h.batches.finish();
    CHECK(h.sent.empty());
    CHECK(h.asked.empty());
  }
  Harness h(0);
  const Viewer ada = viewer(0), bob = viewer(1);
  h.batches.add({0, 0}, &kTodo, ada);
  h.batches.add({1, 0}, &kTodo, bob);
  h.batches.finish();
  CHECK(h.sent.size() == 2);
}
