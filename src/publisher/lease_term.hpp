#pragma once
// The replica's lease (sql/006) as the publisher's own clock sees it: the epoch it holds (0: none),
// when the next round is due, and the fence: until when it may publish under that epoch. A loop
// frozen past that point publishes nothing it held (SPEC 1 rev 3). One thread, no locks.
#include <chrono>
#include <cstdint>

#include "common/clock.hpp"

namespace outlive::publisher {

class LeaseTerm {
 public:
  // A renewal every `renew`; Postgres ends a lease `ttl` after its last renewal, and this side
  // stops publishing `margin` before that.
  LeaseTerm(std::chrono::milliseconds renew, std::chrono::milliseconds ttl,
            std::chrono::milliseconds margin)
      : renew_(renew), ttl_(ttl), margin_(margin) {}

  int64_t epoch() const { return epoch_; }
  bool held() const { return epoch_ != 0; }
  bool round_due(Clock::time_point now) const { return now >= next_round_; }
  Clock::time_point next_round() const { return next_round_; }
  void round_now(Clock::time_point now) { next_round_ = now; }

  // The answer to a round sent at `sent`: the epoch Postgres says this member holds now. False
  // when the answer came too late to prove anything (it took longer than the lease): the caller
  // assigns nothing from it, and another round is due at once.
  bool renewed(int64_t epoch, Clock::time_point sent, Clock::time_point now);

  // Whether a publish may go out now. A refusal is remembered: the next fence() drops what is
  // held, as nothing else would send those rows if a renewal came first.
  bool may_send(Clock::time_point now);
  // Once per loop turn, before any result is handled: true when the lease may have run out by
  // this clock (or a send was refused since), so everything held must be dropped.
  bool fence(Clock::time_point now);
  // The lease is given up (lost, ended, or its connection gone); a round is due at once.
  void drop(Clock::time_point now);

 private:
  std::chrono::milliseconds renew_, ttl_, margin_;
  int64_t epoch_ = 0;
  Clock::time_point until_{};
  Clock::time_point next_round_{};
  bool refused_ = false;
};

}  // namespace outlive::publisher
