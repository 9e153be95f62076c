// A connection's liveness clocks (ws/liveness): ping, idle, stall, an unanswered close and the
// protocol's deadline, each at its limit and just before it. Pure: the time is the test's.
#include <catch2/catch.hpp>

#include "ws/liveness.hpp"

using namespace outlive::ws;
using namespace std::chrono_literals;
using Clock = Liveness::Clock;

namespace {
ConnectionSettings settings() {
  ConnectionSettings s;
  s.ping_interval = 25s;
  s.idle_timeout = 60s;
  s.stall_timeout = 30s;
  s.close_timeout = 5s;
  return s;
}
}  // namespace

TEST_CASE("liveness: a ping is due at ping_interval, not before, and then counts as sent") {
  const auto s = settings();
  Liveness l(s);
  const auto t0 = Clock::now();
  l.start(t0);
  CHECK(l.next(false) == t0 + 25s);
  CHECK_FALSE(l.take_ping(t0 + 25s - 1ms));
  CHECK(l.take_ping(t0 + 25s));
  CHECK_FALSE(l.take_ping(t0 + 25s));
  CHECK(l.next(false) == t0 + 50s);
}

TEST_CASE("liveness: silent at idle_timeout after the last byte received, not before") {
  const auto s = settings();
  Liveness l(s);
  const auto t0 = Clock::now();
  l.start(t0);
  l.received(t0 + 10s);
  CHECK_FALSE(l.silent(t0 + 70s - 1ms));
  CHECK(l.silent(t0 + 70s));
}

TEST_CASE("liveness: stalled at stall_timeout with frames waiting, never while none wait") {
  const auto s = settings();
  Liveness l(s);
  const auto t0 = Clock::now();
  l.start(t0);
  l.taken(t0 + 1s);
  CHECK(l.next(true) == t0 + 25s);  // the ping comes first
  l.take_ping(t0 + 25s);
  CHECK(l.next(true) == t0 + 31s);
  CHECK_FALSE(l.stalled(t0 + 31s - 1ms, true));
  CHECK(l.stalled(t0 + 31s, true));
  CHECK_FALSE(l.stalled(t0 + 300s, false));
}

TEST_CASE("liveness: our close is unanswered at close_timeout, not before") {
  const auto s = settings();
  Liveness l(s);
  const auto t0 = Clock::now();
  l.start(t0);
  CHECK_FALSE(l.close_unanswered(t0 + 1000s));  // no close sent
  l.closing(t0 + 2s);
  CHECK(l.next(false) == t0 + 7s);
  CHECK_FALSE(l.close_unanswered(t0 + 7s - 1ms));
  CHECK(l.close_unanswered(t0 + 7s));
}

TEST_CASE("liveness: the protocol's deadline fires once, and a cleared one never") {
  const auto s = settings();
  Liveness l(s);
  const auto t0 = Clock::now();
  l.start(t0);
  l.set_deadline(t0 + 3s);
  CHECK(l.next(false) == t0 + 3s);
  CHECK_FALSE(l.take_deadline(t0 + 3s - 1ms));
  CHECK(l.take_deadline(t0 + 3s));
  CHECK_FALSE(l.take_deadline(t0 + 4s));
  CHECK(l.next(false) == t0 + 25s);
  l.set_deadline(t0 + 5s);
  l.clear_deadline();
  CHECK_FALSE(l.take_deadline(t0 + 100s));
}
