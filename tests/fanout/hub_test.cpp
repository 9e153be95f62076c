// One app's hub: who follows which key, and its list of readers for the progress tick (only those
// not settled at the app's hand-off).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fanout/hub.hpp"

using namespace outlive;

namespace {

class FakeReader : public fanout::Reader {
 public:
  bool offer(std::vector<fanout::Delivery>&&, uint64_t) override { return false; }
  void take() override {}
  void progress(const fanout::ProgressTick&) override {}
  void refresh_collections() override {}
  void shut_down() override {}
  void end_after(uint64_t) override {}
  void disconnect(const std::string&) override {}
  void settle_at(uint64_t position) { settle(position); }
  void leave_live() { unsettle(); }
};

bool holds(const std::vector<std::shared_ptr<fanout::Reader>>& list, const fanout::Reader* r) {
  return std::any_of(list.begin(), list.end(), [&](const auto& x) { return x.get() == r; });
}

}  // namespace

TEST_CASE("the progress tick is given the readers of its app not settled at the hand-off") {
  fanout::Hub hub;
  fanout::Hub other_hub;  // another app's
  auto settled = std::make_shared<FakeReader>();
  auto behind = std::make_shared<FakeReader>();
  auto fresh = std::make_shared<FakeReader>();
  auto other_app = std::make_shared<FakeReader>();
  hub.add_reader(settled);
  hub.add_reader(behind);
  hub.add_reader(fresh);
  other_hub.add_reader(other_app);
  settled->settle_at(100);
  behind->settle_at(99);

  auto list = hub.unsettled_readers(100);
  CHECK(list.size() == 2);
  CHECK(holds(list, behind.get()));
  CHECK(holds(list, fresh.get()));  // never settled: 0
  CHECK_FALSE(holds(list, settled.get()));
  CHECK_FALSE(holds(list, other_app.get()));

  // Past its settled position, or unsettled, a reader is visited again.
  CHECK(holds(hub.unsettled_readers(101), settled.get()));
  settled->leave_live();
  CHECK(holds(hub.unsettled_readers(100), settled.get()));

  // Settled never goes back: a late settle at a lower position keeps the higher one.
  behind->settle_at(120);
  behind->settle_at(110);
  CHECK(behind->settled() == 120);
  CHECK_FALSE(holds(hub.unsettled_readers(120), behind.get()));

  // A reader that left is not listed.
  hub.remove_reader(fresh.get());
  CHECK_FALSE(holds(hub.unsettled_readers(100), fresh.get()));
  CHECK(other_hub.unsettled_readers(1).size() == 1);
}

namespace {

// The readers a key's update would reach, with the channels each follows it through.
std::map<const fanout::Reader*, std::set<std::string>> reached(fanout::Hub& hub,
                                                               const std::string& key) {
  std::map<const fanout::Reader*, std::set<std::string>> out;
  const auto targets = hub.targets(key, 1);
  for (const auto& t : *targets) {
    for (const auto* channel : t.channels) out[t.reader.get()].insert(*channel);
  }
  CHECK(out.size() == targets->size());  // no reader listed twice
  return out;
}

auto viewer() { return std::make_shared<const fanout::Viewer>(fanout::Viewer{"v", "{}"}); }

}  // namespace

TEST_CASE("a follower that leaves a key takes no other follower with it") {
  fanout::Hub hub;
  std::vector<std::shared_ptr<FakeReader>> r;
  for (int i = 0; i < 4; ++i) {
    r.push_back(std::make_shared<FakeReader>());
    hub.add_reader(r.back());
    hub.follow({"k"}, "c", r.back(), viewer());
  }
  CHECK(reached(hub, "k").size() == 4);
  // The first leaves: the last takes its place and must still be found where it now sits.
  hub.unfollow("k", "c", r[0].get());
  CHECK(reached(hub, "k").size() == 3);
  CHECK_FALSE(reached(hub, "k").count(r[0].get()));
  hub.unfollow("k", "c", r[3].get());
  auto left = reached(hub, "k");
  CHECK(left.size() == 2);
  CHECK(left.count(r[1].get()));
  CHECK(left.count(r[2].get()));
  // A key it does not follow, or a channel it does not follow it through, changes nothing.
  hub.unfollow("kk", "c", r[1].get());
  hub.unfollow("k", "other", r[1].get());
  CHECK(reached(hub, "k").size() == 2);
  hub.unfollow("k", "c", r[2].get());
  hub.unfollow("k", "c", r[1].get());
  CHECK(reached(hub, "k").empty());
  // Following again after leaving works from an empty key.
  hub.follow({"k"}, "c", r[3], viewer());
  CHECK(reached(hub, "k").size() == 1);
}

TEST_CASE("a key followed through two channels is left channel by channel") {
  fanout::Hub hub;
  auto r = std::make_shared<FakeReader>();
  hub.add_reader(r);
  hub.follow({"k"}, "x", r, viewer());
  hub.follow({"k"}, "x", r, viewer());  // two subscriptions through x
  hub.follow({"k"}, "y", r, viewer());
  CHECK(reached(hub, "k")[r.get()] == std::set<std::string>{"x", "y"});
  hub.unfollow("k", "x", r.get());
  CHECK(reached(hub, "k")[r.get()] == std::set<std::string>{"x", "y"});
  hub.unfollow("k", "x", r.get());
  CHECK(reached(hub, "k")[r.get()] == std::set<std::string>{"y"});
  hub.unfollow("k", "y", r.get());
  CHECK(reached(hub, "k").empty());
}

TEST_CASE("a reader that leaves the hub leaves every key it followed, and only those") {
  fanout::Hub hub;
  auto gone = std::make_shared<FakeReader>();
  auto stays = std::make_shared<FakeReader>();
  hub.add_reader(gone);
  hub.add_reader(stays);
  hub.follow({"k1", "k2", "k3"}, "c", gone, viewer());
  hub.follow({"k2"}, "c", stays, viewer());
  hub.remove_reader(gone.get());
  CHECK(reached(hub, "k1").empty());
  CHECK(reached(hub, "k3").empty());
  CHECK(reached(hub, "k2").size() == 1);
  CHECK(reached(hub, "k2").count(stays.get()));
  CHECK(hub.reader_count() == 1);
  // A reader that left (a socket finishing) or was never added follows nothing.
  hub.follow({"k1"}, "c", gone, viewer());
  hub.follow({"k1"}, "c", std::make_shared<FakeReader>(), viewer());
  CHECK(reached(hub, "k1").empty());
  CHECK(hub.reader_count() == 1);
}

TEST_CASE("follows and leaves in any order reach exactly the readers that follow") {
  // Against a plain model: key -> reader -> channel -> subscriptions.
  fanout::Hub hub;
  const std::vector<std::string> keys{"k0", "k1", "k2", "k3", "k4"};
  const std::vector<std::string> channels{"x", "y"};
  std::vector<std::shared_ptr<FakeReader>> readers;
  for (int i = 0; i < 12; ++i) {
    readers.push_back(std::make_shared<FakeReader>());
    hub.add_reader(readers.back());
  }
  std::map<std::string, std::map<const fanout::Reader*, std::map<std::string, int>>> model;
  std::mt19937 rng(20261203);
  for (int step = 0; step < 4000; ++step) {
    const auto& reader = readers[rng() % readers.size()];
    const auto& key = keys[rng() % keys.size()];
    const auto& channel = channels[rng() % channels.size()];
    const int op = rng() % 10;
    if (op < 5) {
      hub.follow({key}, channel, reader, viewer());
      ++model[key][reader.get()][channel];
    } else if (op < 9) {
      hub.unfollow(key, channel, reader.get());
      auto& n = model[key][reader.get()];
      if (n.count(channel) && --n[channel] == 0) n.erase(channel);
    } else {
      hub.remove_reader(reader.get());
      for (auto& [k, by_reader] : model) by_reader.erase(reader.get());
      hub.add_reader(reader);
    }
    if (step % 50 != 0) continue;
    for (const auto& k : keys) {
      std::map<const fanout::Reader*, std::set<std::string>> expected;
      for (const auto& [raw, by_channel] : model[k]) {
        for (const auto& [c, n] : by_channel) expected[raw].insert(c);
      }
      INFO("step " << step << " key " << k);
      CHECK(reached(hub, k) == expected);
    }
  }
}

TEST_CASE("readers that join, leave and join again are each walked once") {
  // Against a plain model: the set of readers in the hub. A reader that leaves has the last of the
  // list take its place; one added while in the hub stays in it once.
  fanout::Hub hub;
  std::vector<std::shared_ptr<FakeReader>> readers;
  for (int i = 0; i < 20; ++i) readers.push_back(std::make_shared<FakeReader>());
  std::set<const fanout::Reader*> model;
  std::mt19937 rng(20261204);
  for (int step = 0; step < 3000; ++step) {
    const auto& reader = readers[rng() % readers.size()];
    const int op = rng() % 10;
    if (op < 4) {
      hub.add_reader(reader);
      model.insert(reader.get());
    } else if (op < 7) {
      hub.remove_reader(reader.get());
      model.erase(reader.get());
    } else {
      reader->settle_at(static_cast<uint64_t>(step));
    }
    if (step % 25 != 0) continue;
    INFO("step " << step);
    CHECK(hub.reader_count() == model.size());
    std::multiset<const fanout::Reader*> walked;
    hub.for_each_reader([&](fanout::Reader& r) { walked.insert(&r); });
    std::multiset<const fanout::Reader*> expected, unsettled_expected, unsettled;
    for (const auto* raw : model) {
      expected.insert(raw);
      if (raw->settled() < static_cast<uint64_t>(step)) unsettled_expected.insert(raw);
    }
    for (const auto& r : hub.unsettled_readers(static_cast<uint64_t>(step)))
      unsettled.insert(r.get());
    CHECK(walked == expected);
    std::multiset<const fanout::Reader*> listed;
    for (const auto& r : hub.readers()) listed.insert(r.get());
    CHECK(listed == expected);
    CHECK(unsettled == unsettled_expected);
  }
}
