// The hub's list of readers for the progress tick: only those not settled at the app's hand-off.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>

#include "fanout/hub.hpp"

using namespace outlive;

namespace {

class FakeReader : public fanout::Reader {
 public:
  bool offer(std::vector<fanout::Delivery>&&, uint64_t) override { return false; }
  void take() override {}
  void progress(uint64_t) override {}
  void refresh_collections() override {}
  void shut_down() override {}
  void settle_at(uint64_t position) { settle(position); }
  void leave_live() { unsettle(); }
};

bool holds(const std::vector<std::shared_ptr<fanout::Reader>>& list, const fanout::Reader* r) {
  return std::any_of(list.begin(), list.end(), [&](const auto& x) { return x.get() == r; });
}

}  // namespace

TEST_CASE("the progress tick is given the readers of its app not settled at the hand-off") {
  fanout::Hub hub;
  auto settled = std::make_shared<FakeReader>();
  auto behind = std::make_shared<FakeReader>();
  auto fresh = std::make_shared<FakeReader>();
  auto other_app = std::make_shared<FakeReader>();
  hub.add_reader("a", settled);
  hub.add_reader("a", behind);
  hub.add_reader("a", fresh);
  hub.add_reader("b", other_app);
  settled->settle_at(100);
  behind->settle_at(99);

  auto list = hub.unsettled_readers("a", 100);
  CHECK(list.size() == 2);
  CHECK(holds(list, behind.get()));
  CHECK(holds(list, fresh.get()));  // never settled: 0
  CHECK_FALSE(holds(list, settled.get()));
  CHECK_FALSE(holds(list, other_app.get()));

  // Past its settled position, or unsettled, a reader is visited again.
  CHECK(holds(hub.unsettled_readers("a", 101), settled.get()));
  settled->leave_live();
  CHECK(holds(hub.unsettled_readers("a", 100), settled.get()));

  // Settled never goes back: a late settle at a lower position keeps the higher one.
  behind->settle_at(120);
  behind->settle_at(110);
  CHECK(behind->settled() == 120);
  CHECK_FALSE(holds(hub.unsettled_readers("a", 120), behind.get()));

  // A reader that left is not listed.
  hub.remove_reader(fresh.get());
  CHECK_FALSE(holds(hub.unsettled_readers("a", 100), fresh.get()));
  CHECK(hub.unsettled_readers("b", 1).size() == 1);
}
