#pragma once
// Whether this replica can publish at all (SPEC 1 rev 3): a replica cut off from NATS holds no
// keys. The publisher's loop tells it what it sent and what NATS answered; it says when to give
// every partition up, when to probe, and when NATS answers again. One thread, no locks.
#include <chrono>
#include <optional>

#include "common/clock.hpp"

namespace outlive::publisher {

class NatsHealth {
 public:
  enum class Verdict {
    none,        // nothing changes
    give_up,     // NATS silent for `silence`: give every partition up, ask for none
    able_again,  // the probe was answered: take a share again
    probe,       // send a probe now (a publish nobody stores: NATS answers "no responders")
  };

  explicit NatsHealth(std::chrono::milliseconds silence) : silence_(silence) {}

  void reset();
  bool able() const { return able_; }
  // A publish (or the probe) went out at `now`; what is unanswered counts from the first one.
  void sent(Clock::time_point now);
  // NATS answered something (an ack, a refusal, "no responders"): it is alive.
  void answered(Clock::time_point now);
  // Once per loop turn, with whether the client is connected now.
  Verdict check(Clock::time_point now, bool connected);

  static constexpr auto kProbeInterval = std::chrono::seconds(1);

 private:
  std::chrono::milliseconds silence_;
  bool able_ = true;
  Clock::time_point last_answer_{};
  std::optional<Clock::time_point> unanswered_since_;
  std::optional<Clock::time_point> disconnected_since_;
  Clock::time_point next_probe_{};
  std::optional<Clock::time_point> probe_sent_at_;
};

}  // namespace outlive::publisher
