// The publisher's ownership clocks, pure (publisher/lease_term.hpp, publisher/nats_health.hpp):
// the fence that stops a frozen loop from publishing what it held, and the NATS silence that
// makes a replica give its partitions up (SPEC 1 rev 3). Time is passed in, never slept.
#include <catch2/catch.hpp>

#include "publisher/lease_term.hpp"
#include "publisher/nats_health.hpp"

using namespace std::chrono_literals;
using outlive::Clock;
using outlive::publisher::LeaseTerm;
using outlive::publisher::NatsHealth;

namespace {
const Clock::time_point t0 = Clock::time_point(1000s);
LeaseTerm term() { return LeaseTerm(500ms, 3000ms, 500ms); }
}  // namespace

TEST_CASE("a renewed lease allows sends until its send time plus the ttl less the margin") {
  auto t = term();
  CHECK_FALSE(t.may_send(t0));  // nothing held yet: refused, but nothing to fence either
  CHECK_FALSE(t.fence(t0));
  REQUIRE(t.renewed(7, t0, t0 + 10ms));
  CHECK(t.epoch() == 7);
  CHECK(t.next_round() == t0 + 500ms);
  CHECK(t.may_send(t0 + 2499ms));
  CHECK_FALSE(t.fence(t0 + 2499ms));
  // 2.5 s after the round was sent: a loop frozen that long publishes nothing more.
  CHECK_FALSE(t.may_send(t0 + 2500ms));
  CHECK(t.fence(t0 + 2500ms));
}

TEST_CASE("a refused send is fenced at the next turn even if a renewal came first") {
  auto t = term();
  REQUIRE(t.renewed(7, t0, t0));
  CHECK_FALSE(t.may_send(t0 + 2600ms));
  REQUIRE(t.renewed(7, t0 + 2600ms, t0 + 2601ms));  // the round answered before the fence ran
  CHECK(t.fence(t0 + 2602ms));                      // what the refusal left waiting is dropped
  CHECK_FALSE(t.fence(t0 + 2603ms));                // once
}

TEST_CASE("an answer slower than the lease proves nothing and asks for another round") {
  auto t = term();
  CHECK_FALSE(t.renewed(7, t0, t0 + 2500ms));
  CHECK(t.round_due(t0 + 2500ms));
  CHECK_FALSE(t.may_send(t0 + 2500ms));
}

TEST_CASE("a dropped lease holds no epoch, sends nothing and wants a round at once") {
  auto t = term();
  REQUIRE(t.renewed(7, t0, t0));
  t.drop(t0 + 100ms);
  CHECK_FALSE(t.held());
  CHECK(t.round_due(t0 + 100ms));
  CHECK_FALSE(t.may_send(t0 + 100ms));
  CHECK_FALSE(t.fence(t0 + 100ms));
}

TEST_CASE("NATS silent for the bound while a publish waits gives the partitions up") {
  NatsHealth h(2000ms);
  CHECK(h.check(t0, true) == NatsHealth::Verdict::none);
  h.sent(t0);
  h.sent(t0 + 1500ms);  // unanswered counts from the first
  CHECK(h.check(t0 + 1999ms, true) == NatsHealth::Verdict::none);
  CHECK(h.check(t0 + 2000ms, true) == NatsHealth::Verdict::give_up);
  CHECK_FALSE(h.able());
}

TEST_CASE("an answer within the bound keeps the replica able") {
  NatsHealth h(2000ms);
  h.sent(t0);
  h.answered(t0 + 1900ms);
  CHECK(h.check(t0 + 3000ms, true) == NatsHealth::Verdict::none);
  CHECK(h.able());
}

TEST_CASE("disconnected for the bound gives up, then probes each second until one is answered") {
  NatsHealth h(2000ms);
  CHECK(h.check(t0, false) == NatsHealth::Verdict::none);
  CHECK(h.check(t0 + 1999ms, false) == NatsHealth::Verdict::none);
  CHECK(h.check(t0 + 2000ms, false) == NatsHealth::Verdict::give_up);
  CHECK(h.check(t0 + 2000ms, false) == NatsHealth::Verdict::probe);
  CHECK(h.check(t0 + 2500ms, false) == NatsHealth::Verdict::none);
  CHECK(h.check(t0 + 3000ms, false) == NatsHealth::Verdict::probe);
  // Answered while still disconnected (a stale answer): not yet.
  h.answered(t0 + 3100ms);
  CHECK(h.check(t0 + 3200ms, false) == NatsHealth::Verdict::none);
  CHECK(h.check(t0 + 3300ms, true) == NatsHealth::Verdict::able_again);
  CHECK(h.able());
}

TEST_CASE("an answer older than the probe does not make the replica able") {
  NatsHealth h(2000ms);
  h.answered(t0);
  h.sent(t0 + 100ms);
  CHECK(h.check(t0 + 2100ms, true) == NatsHealth::Verdict::give_up);
  CHECK(h.check(t0 + 2200ms, true) == NatsHealth::Verdict::probe);
  CHECK(h.check(t0 + 2300ms, true) == NatsHealth::Verdict::none);  // no answer since the probe
  h.answered(t0 + 2400ms);
  CHECK(h.check(t0 + 2500ms, true) == NatsHealth::Verdict::able_again);
}
