// How long the publisher's loop sleeps for a deadline (publisher/loop_wake): poll() counts whole
// milliseconds, so a deadline less than one away must still be slept to, never spun on.
#include <catch2/catch.hpp>

#include "publisher/loop_wake.hpp"

using outlive::publisher::LoopWake;
using namespace std::chrono_literals;

TEST_CASE("loop wake: a deadline under a millisecond away is a 1 ms poll, not 0") {
  CHECK(LoopWake::poll_timeout_ms(1ns) == 1);
  CHECK(LoopWake::poll_timeout_ms(300us) == 1);
  CHECK(LoopWake::poll_timeout_ms(999'999ns) == 1);
}

TEST_CASE("loop wake: whole milliseconds stay, a part of one more rounds up") {
  CHECK(LoopWake::poll_timeout_ms(1ms) == 1);
  CHECK(LoopWake::poll_timeout_ms(1ms + 1ns) == 2);
  CHECK(LoopWake::poll_timeout_ms(100ms) == 100);
  CHECK(LoopWake::poll_timeout_ms(99ms + 500us) == 100);
}

TEST_CASE("loop wake: a deadline due or past is a poll that does not wait") {
  CHECK(LoopWake::poll_timeout_ms(0ns) == 0);
  CHECK(LoopWake::poll_timeout_ms(-1ns) == 0);
  CHECK(LoopWake::poll_timeout_ms(-5s) == 0);
}
