#pragma once
#include <algorithm>
#include <chrono>

namespace outlive::publisher {

// Delay before retrying an update whose publish failed `failures` times (1 s doubling, capped).
inline std::chrono::milliseconds backoff_delay(
    int failures, std::chrono::milliseconds base = std::chrono::seconds(1),
    std::chrono::milliseconds cap = std::chrono::minutes(5)) {
  if (failures <= 0) return std::chrono::milliseconds(0);
  const int doublings = std::min(failures - 1, 30);
  const auto delay = base.count() * (int64_t{1} << doublings);
  return std::chrono::milliseconds(std::min<int64_t>(delay, cap.count()));
}

}  // namespace outlive::publisher
