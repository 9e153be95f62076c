#include "publisher/lease_term.hpp"

#include <utility>

namespace outlive::publisher {

bool LeaseTerm::renewed(int64_t epoch, Clock::time_point sent, Clock::time_point now) {
  epoch_ = epoch;
  // The server's expiry is its now() + ttl, taken no earlier than `sent`: by this clock the
  // lease holds at least until sent + ttl, and the loop stops publishing a margin before.
  until_ = sent + ttl_ - margin_;
  if (now >= until_) {
    // The answer took longer than the lease (a partition that ended just now): by this clock
    // it proves nothing. Another round at once, while the server's expiry is fresh.
    next_round_ = now;
    return false;
  }
  next_round_ = sent + renew_;
  return true;
}

bool LeaseTerm::may_send(Clock::time_point now) {
  if (epoch_ != 0 && now < until_) return true;
  refused_ = epoch_ != 0;
  return false;
}

bool LeaseTerm::fence(Clock::time_point now) {
  return epoch_ != 0 && (now >= until_ || std::exchange(refused_, false));
}

void LeaseTerm::drop(Clock::time_point now) {
  epoch_ = 0;
  refused_ = false;
  next_round_ = now;
}

}  // namespace outlive::publisher
