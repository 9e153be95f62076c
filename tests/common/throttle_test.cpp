// common/throttle.hpp: at most `limit` slots held, the rest waiting in order.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "common/throttle.hpp"

using outlive::Throttle;

TEST_CASE("a throttle runs at most its limit at once and starts the waiting in order") {
  Throttle throttle(2);
  std::vector<int> started;
  std::vector<Throttle::Slot> held;
  held.reserve(8);  // (jobs append while a slot of it is being reset)
  for (int i = 0; i < 5; ++i) {
    throttle.run([&, i](Throttle::Slot slot) {
      started.push_back(i);
      held.push_back(std::move(slot));
    });
  }
  CHECK(started == std::vector<int>{0, 1});
  CHECK(throttle.running() == 2);
  CHECK(throttle.waiting() == 3);

  // Giving a slot back starts the next job in order; a slot with copies is given back with its
  // last.
  auto copy = held[0];
  held[0].reset();
  CHECK(started.size() == 2);
  copy.reset();
  CHECK(started == std::vector<int>{0, 1, 2});
  CHECK(throttle.running() == 2);

  // A job whose slot is dropped at once (its work refused) lets the next one run.
  throttle.run([&](Throttle::Slot) { started.push_back(99); });  // waits behind 3 and 4
  held[1].reset();
  held[2].reset();
  CHECK(started == std::vector<int>{0, 1, 2, 3, 4});
  held[3].reset();  // 99 runs and drops its slot: nothing waits, so one slot stays held (4's)
  CHECK(started.back() == 99);
  CHECK(throttle.waiting() == 0);
  CHECK(throttle.running() == 1);
  held.clear();
  CHECK(throttle.running() == 0);
}

TEST_CASE("after stop a throttle drops what waits and starts nothing, and slots still come back") {
  Throttle throttle(1);
  Throttle::Slot held;
  int ran = 0;
  throttle.run([&](Throttle::Slot s) { ++ran, held = std::move(s); });
  throttle.run([&](Throttle::Slot) { ++ran; });
  throttle.stop();
  CHECK(throttle.waiting() == 0);
  held.reset();
  throttle.run([&](Throttle::Slot) { ++ran; });
  CHECK(ran == 1);
  CHECK(throttle.running() == 0);
}

TEST_CASE("a throttle shared by threads never holds more than its limit") {
  Throttle throttle(3);
  std::atomic<int> inside{0}, most{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        throttle.run([&](Throttle::Slot slot) {
          const int now = ++inside;
          int seen = most.load();
          while (now > seen && !most.compare_exchange_weak(seen, now)) {
          }
          --inside;  // before the slot goes back
          slot.reset();
          ++done;
        });
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(done == 2000);
  CHECK(most <= 3);
  CHECK(throttle.running() == 0);
}
