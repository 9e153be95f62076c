#include "common/log_limiter.hpp"

#include <algorithm>

namespace outlive::log {

LineLimiter::LineLimiter(double per_second, double burst, std::chrono::milliseconds window)
    : per_second_(per_second > 0 ? per_second : 1), burst_(std::max(burst, 1.0)), window_(window) {}

LineLimiter::Verdict LineLimiter::admit(std::string_view message, Level level,
                                        Clock::time_point now) {
  std::lock_guard lock(mutex_);
  auto it = buckets_.find(message);
  if (it == buckets_.end()) {
    it = buckets_.emplace(std::string(message), Bucket{burst_, now}).first;
  }
  Bucket& b = it->second;
  if (now > b.refilled) {
    const double seconds = std::chrono::duration<double>(now - b.refilled).count();
    b.tokens = std::min(burst_, b.tokens + seconds * per_second_);
    b.refilled = now;
  }
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return Verdict::write;
  }
  b.level = level;
  if (b.suppressed++ > 0) return Verdict::counted;
  b.report_at = now + window_;
  return Verdict::counted_first;
}

std::vector<LineLimiter::Suppressed> LineLimiter::take_due(Clock::time_point now) {
  std::vector<Suppressed> due;
  std::lock_guard lock(mutex_);
  for (auto& [message, b] : buckets_) {
    if (b.suppressed == 0 || b.report_at > now) continue;
    due.push_back({message, b.level, b.suppressed});
    b.suppressed = 0;
  }
  return due;
}

LineLimiter::Clock::time_point LineLimiter::next_due() const {
  auto next = Clock::time_point::max();
  std::lock_guard lock(mutex_);
  for (const auto& [_, b] : buckets_) {
    if (b.suppressed > 0) next = std::min(next, b.report_at);
  }
  return next;
}

}  // namespace outlive::log
