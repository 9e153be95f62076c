// The wheel of deadlines every connection of an io thread shares (ws/deadlines.hpp): hermetic, an
// io_context and fake connections.
#include <catch2/catch.hpp>

#include "ws/deadlines.hpp"

using namespace outlive::ws;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// A connection as the wheel sees it: one armed deadline at most, matched by one disarm().
template <size_t Slots>
struct Fake : std::enable_shared_from_this<Fake<Slots>> {
  using Wheel = DeadlineWheel<Fake, Slots>;
  explicit Fake(boost::asio::io_context& io) : wheel(Wheel::of(io.get_executor())) {}
  ~Fake() {
    if (armed) wheel.disarm();
  }
  Wheel& wheel;
  uint32_t generation = 0;
  bool armed = false;
  std::vector<std::pair<uint32_t, Clock::time_point>> fired;

  void arm(Clock::time_point at) {
    if (armed) wheel.disarm();  // the entry armed now is replaced
    armed = true;
    wheel.add(at, this->shared_from_this(), ++generation);
  }
  void on_deadline_entry(uint32_t g) {
    if (g != generation || !armed) return;
    armed = false;
    wheel.disarm();
    fired.emplace_back(g, Clock::now());
  }
};

}  // namespace

TEST_CASE("deadlines fire in order, never early, and the wheel rests once none is armed") {
  boost::asio::io_context io;
  const auto start = Clock::now();
  std::vector<std::shared_ptr<Fake<2048>>> fakes;
  const std::vector<std::chrono::milliseconds> after = {60ms, 0ms, 25ms, 7ms, 25ms};
  for (auto a : after) {
    fakes.push_back(std::make_shared<Fake<2048>>(io));
    fakes.back()->arm(start + a);
  }
  // run() returns once nothing is left to do: the wheel stopped turning.
  io.run_for(10s);
  CHECK(io.stopped());
  CHECK_FALSE(fakes[0]->wheel.turning());
  CHECK(fakes[0]->wheel.entries() == 0);
  for (size_t i = 0; i < fakes.size(); ++i) {
    INFO("deadline " << i);
    REQUIRE(fakes[i]->fired.size() == 1);
    const auto at = fakes[i]->fired[0].second;
    CHECK(at >= start + after[i]);
    CHECK(at < start + after[i] + 500ms);  // a tick (5 ms) late plus scheduling on a busy machine
  }
  CHECK(fakes[1]->fired[0].second <= fakes[3]->fired[0].second);
  CHECK(fakes[3]->fired[0].second <= fakes[2]->fired[0].second);
  CHECK(fakes[2]->fired[0].second <= fakes[0]->fired[0].second);
}

TEST_CASE("a replaced deadline and the deadline of a connection that is gone never fire") {
  boost::asio::io_context io;
  const auto start = Clock::now();
  auto replaced = std::make_shared<Fake<2048>>(io);
  replaced->arm(start + 40ms);
  replaced->arm(start + 10ms);  // earlier: the first entry is stale
  auto later = std::make_shared<Fake<2048>>(io);
  later->arm(start + 10ms);
  later->arm(start + 30ms);  // later: the first entry is stale too
  auto gone = std::make_shared<Fake<2048>>(io);
  gone->arm(start + 5ms);
  gone.reset();  // destroyed with its deadline armed: disarmed by its destructor
  io.run_for(10s);
  CHECK(io.stopped());
  REQUIRE(replaced->fired.size() == 1);
  CHECK(replaced->fired[0].first == 2);
  CHECK(replaced->fired[0].second < start + 40ms + 500ms);
  REQUIRE(later->fired.size() == 1);
  CHECK(later->fired[0].first == 2);
  CHECK(later->fired[0].second >= start + 30ms);
}

TEST_CASE("a deadline further away than a turn of the wheel waits for its own turn") {
  boost::asio::io_context io;
  // 8 slots of 5 ms: a turn is 40 ms, so 100 ms lies two turns and a half ahead.
  auto far = std::make_shared<Fake<8>>(io);
  auto near = std::make_shared<Fake<8>>(io);
  const auto start = Clock::now();
  far->arm(start + 100ms);
  near->arm(start + 20ms);
  io.run_for(10s);
  REQUIRE(far->fired.size() == 1);
  REQUIRE(near->fired.size() == 1);
  CHECK(far->fired[0].second >= start + 100ms);
  CHECK(near->fired[0].second >= start + 20ms);
  CHECK(near->fired[0].second < far->fired[0].second);
}

TEST_CASE("a deadline already passed fires at the next tick, and a connection re-arms from it") {
  boost::asio::io_context io;
  auto c = std::make_shared<Fake<2048>>(io);
  const auto start = Clock::now();
  c->arm(start - 1s);
  // Armed again after the wheel came to rest (nothing armed): it turns again.
  boost::asio::steady_timer rearm(io, 50ms);
  rearm.async_wait([&](boost::system::error_code) { c->arm(Clock::now() + 10ms); });
  io.run_for(10s);
  REQUIRE(c->fired.size() == 2);
  CHECK(c->fired[0].second < start + 500ms);
  CHECK(c->fired[1].second >= start + 60ms);
}

TEST_CASE("the wheel sleeps until its next deadline instead of waking every tick") {
  boost::asio::io_context io;
  auto c = std::make_shared<Fake<2048>>(io);
  const auto start = Clock::now();
  c->arm(start + 300ms);  // 60 ticks away
  io.run_for(10s);
  REQUIRE(c->fired.size() == 1);
  CHECK(c->fired[0].second >= start + 300ms);
  CHECK(c->wheel.wakeups() <= 2);  // one, or two if the timer woke a tick early
}

TEST_CASE("far deadlines of many connections fire together, never early, late by 1/32 at most") {
  boost::asio::io_context io;
  const auto start = Clock::now();
  std::vector<std::shared_ptr<Fake<2048>>> fakes;
  std::vector<Clock::time_point> due;
  // 200 deadlines 2 ms apart, 1.0 to 1.4 s away: 80 ticks hold one; coalesced, a few dozen.
  for (int i = 0; i < 200; ++i) {
    fakes.push_back(std::make_shared<Fake<2048>>(io));
    due.push_back(start + 1000ms + i * 2ms);
    fakes.back()->arm(due.back());
  }
  io.run_for(10s);
  for (size_t i = 0; i < fakes.size(); ++i) {
    INFO("deadline " << i);
    REQUIRE(fakes[i]->fired.size() == 1);
    const auto at = fakes[i]->fired[0].second;
    CHECK(at >= due[i]);
    // 1/32 of 1.4 s is 44 ms; plus a tick and scheduling on a busy machine.
    CHECK(at < due[i] + 44ms + 5ms + 500ms);
  }
  CHECK(fakes[0]->wheel.wakeups() <= 30);
  CHECK(fakes[0]->wheel.wakeups() >= 2);
}

TEST_CASE("a deadline nearer than the one the wheel sleeps toward wakes it earlier") {
  boost::asio::io_context io;
  const auto start = Clock::now();
  auto far = std::make_shared<Fake<2048>>(io);
  far->arm(start + 3s);
  auto near = std::make_shared<Fake<2048>>(io);
  boost::asio::steady_timer later(io, 10ms);  // armed while the wheel sleeps
  later.async_wait([&](boost::system::error_code) { near->arm(Clock::now() + 20ms); });
  io.run_for(10s);
  REQUIRE(near->fired.size() == 1);
  REQUIRE(far->fired.size() == 1);
  CHECK(near->fired[0].second >= start + 30ms);
  CHECK(near->fired[0].second < start + 1s);
  CHECK(far->fired[0].second >= start + 3s);
}
