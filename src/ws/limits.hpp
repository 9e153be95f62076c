#pragma once
// Per-replica limits of SPEC 5.7 that are pure bookkeeping: socket opens per second and sockets
// per viewer. Thread-safe.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace outlive::ws {

// At most `limit` opens per `period` for one key (a person, or a client address).
class OpenRateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit OpenRateLimiter(int limit = 5,
                           std::chrono::milliseconds period = std::chrono::seconds(1))
      : limit_(limit), period_(period) {}

  // Records an open at `now` and says whether it is allowed. A refused open is not counted.
  bool allow(const std::string& key, Clock::time_point now) {
    std::lock_guard lock(mutex_);
    auto& times = opens_[key];
    // `now` is when the socket opened; checks finish out of order, so keep the times sorted.
    const auto newest = times.empty() ? now : std::max(now, times.back());
    auto expired = times.begin();
    while (expired != times.end() && newest - *expired >= period_) ++expired;
    times.erase(times.begin(), expired);
    const auto in_window = std::count_if(
        times.begin(), times.end(), [&](auto t) { return t > now - period_ && t < now + period_; });
    if (in_window >= limit_) return false;
    times.insert(std::upper_bound(times.begin(), times.end(), now), now);
    prune_if_due(now);
    return true;
  }

  // The same pruning from a timer: a table is emptied even when no open follows a flood.
  void prune_quiet(Clock::time_point now) {
    std::lock_guard lock(mutex_);
    prune_if_due(now);
  }
  size_t keys() {
    std::lock_guard lock(mutex_);
    return opens_.size();
  }

 private:
  // Keys quiet for a period are dropped, at most once a period: the table holds the keys of the
  // last second, not every address ever seen (SPEC 5.7 rev 3). Under mutex_.
  void prune_if_due(Clock::time_point now) {
    if (now - last_prune_ < period_) return;
    last_prune_ = now;
    prune(now);
  }
  void prune(Clock::time_point now) {
    for (auto it = opens_.begin(); it != opens_.end();) {
      if (it->second.empty() || now - it->second.back() >= period_) {
        it = opens_.erase(it);
      } else {
        ++it;
      }
    }
  }
  const int limit_;
  const std::chrono::milliseconds period_;
  std::mutex mutex_;
  // A vector, not a deque: at most `limit_` times each, and a libstdc++ deque costs ~600 bytes
  // even empty (a key per address or person stays until prune()).
  std::unordered_map<std::string, std::vector<Clock::time_point>> opens_;
  Clock::time_point last_prune_{};
};

// At most `limit` open sockets per viewer id.
class SocketCounter {
 public:
  explicit SocketCounter(int limit = 16) : limit_(limit) {}
  bool try_add(const std::string& viewer_id) {
    std::lock_guard lock(mutex_);
    int& n = counts_[viewer_id];
    if (n >= limit_) return false;
    ++n;
    return true;
  }
  void remove(const std::string& viewer_id) {
    std::lock_guard lock(mutex_);
    auto it = counts_.find(viewer_id);
    if (it != counts_.end() && --it->second <= 0) counts_.erase(it);
  }
  int count(const std::string& viewer_id) {
    std::lock_guard lock(mutex_);
    auto it = counts_.find(viewer_id);
    return it == counts_.end() ? 0 : it->second;
  }

 private:
  const int limit_;
  std::mutex mutex_;
  std::unordered_map<std::string, int> counts_;
};

}  // namespace outlive::ws
