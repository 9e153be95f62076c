// A hot key's decisions reused by its next update (fanout/decision_memo.hpp): when they still
// hold, and every way they stop holding. Hermetic.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "fanout/decision_memo.hpp"

using namespace outlive;
using namespace std::chrono_literals;
using Memo = fanout::DecisionMemo;

namespace {

const std::string kChannel = "ch";

fanout::Targets followers(size_t n, size_t channels = 1) {
  auto v = std::make_shared<std::vector<fanout::Target>>();
  for (size_t i = 0; i < n; ++i) {
    fanout::Target t;
    t.viewer = std::make_shared<const fanout::Viewer>(fanout::Viewer{std::to_string(i), "{}"});
    for (size_t c = 0; c < channels; ++c) t.channels.push_back(&kChannel);
    v->push_back(std::move(t));
  }
  return v;
}

}  // namespace

TEST_CASE("decision memo: kept from 16 followers, each through at most 32 channels") {
  CHECK_FALSE(Memo::fits(*followers(15)));
  CHECK(Memo::fits(*followers(16)));
  CHECK(Memo::fits(*followers(16, 32)));
  CHECK_FALSE(Memo::fits(*followers(16, 33)));
}

TEST_CASE("decision memo: reused for the same followers, stamp and time before the expiry") {
  Memo memo;
  const auto targets = followers(16);
  const auto now = Memo::Clock::now();
  memo.keep("k", targets, {1, 2}, now + 10s, std::vector<uint32_t>(16, 1u));
  const auto* found = memo.find("k", targets, {1, 2}, now + 10s - 1ms);
  REQUIRE(found);
  CHECK(found->size() == 16);
  CHECK((*found)[0] == 1u);
  CHECK_FALSE(memo.find("other", targets, {1, 2}, now));
}

TEST_CASE("decision memo: a new stamp, new followers or the expiry drop it") {
  const auto targets = followers(16);
  const auto now = Memo::Clock::now();
  const auto kept = [&] {
    Memo m;
    m.keep("k", targets, {1, 2}, now + 10s, std::vector<uint32_t>(16, 1u));
    return m;
  };
  {
    Memo m = kept();
    CHECK_FALSE(m.find("k", targets, {1, 3}, now));  // a decision of the key changed
    CHECK_FALSE(m.find("k", targets, {1, 2}, now));  // and it is gone
  }
  {
    Memo m = kept();
    CHECK_FALSE(m.find("k", followers(16), {1, 2}, now));  // the followers changed
  }
  {
    Memo m = kept();
    CHECK_FALSE(m.find("k", targets, {1, 2}, now + 10s));  // the earliest decision expired
  }
}

TEST_CASE("decision memo: at most 4096 keys, the next one starts over") {
  Memo memo;
  const auto targets = followers(16);
  const auto now = Memo::Clock::now();
  for (size_t i = 0; i < Memo::kMaxKeys; ++i)
    memo.keep("k" + std::to_string(i), targets, {0, 0}, now + 1min, {});
  CHECK(memo.find("k0", targets, {0, 0}, now));
  memo.keep("one more", targets, {0, 0}, now + 1min, {});
  CHECK_FALSE(memo.find("k1", targets, {0, 0}, now));
  CHECK(memo.find("one more", targets, {0, 0}, now));
}
