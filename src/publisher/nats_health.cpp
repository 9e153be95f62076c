#include "publisher/nats_health.hpp"

namespace outlive::publisher {

void NatsHealth::reset() { *this = NatsHealth(silence_); }

void NatsHealth::sent(Clock::time_point now) {
  if (!unanswered_since_) unanswered_since_ = now;
}

void NatsHealth::answered(Clock::time_point now) {
  last_answer_ = now;
  unanswered_since_.reset();
}

NatsHealth::Verdict NatsHealth::check(Clock::time_point now, bool connected) {
  if (!connected) {
    if (!disconnected_since_) disconnected_since_ = now;
  } else {
    disconnected_since_.reset();
  }
  if (able_) {
    // Unanswered publishes count until NATS answers anything, whether they timed out since (a
    // timeout backs the key off and its next try waits) or not.
    const bool silent = (disconnected_since_ && now - *disconnected_since_ >= silence_) ||
                        (unanswered_since_ && now - *unanswered_since_ >= silence_);
    if (!silent) return Verdict::none;
    unanswered_since_.reset();
    able_ = false;
    next_probe_ = now;
    return Verdict::give_up;
  }
  if (probe_sent_at_ && last_answer_ >= *probe_sent_at_ && !disconnected_since_) {
    able_ = true;
    probe_sent_at_.reset();
    return Verdict::able_again;
  }
  if (now < next_probe_) return Verdict::none;
  next_probe_ = now + kProbeInterval;
  probe_sent_at_ = now;
  return Verdict::probe;
}

}  // namespace outlive::publisher
