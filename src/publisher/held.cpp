#include "publisher/held.hpp"

namespace outlive::publisher {

void App::detach(const std::string& key, KeyState& k, std::optional<Clock::time_point> retry_at) {
  k.detached = true;
  detached.insert(key);
  if (!retry_at) return;
  k.retry_at = retry_at;
  for (const auto& t : k.waiting) known.erase(t.row.position);
  held -= static_cast<int>(k.waiting.size());
  k.waiting.clear();
}

void App::drop_waiting(const std::function<bool(int partition)>& dropped) {
  for (auto it = keys.begin(); it != keys.end();) {
    auto& k = it->second;
    if (!dropped(k.partition)) {
      ++it;
      continue;
    }
    for (const auto& t : k.waiting) known.erase(t.row.position);
    held -= static_cast<int>(k.waiting.size());
    k.waiting.clear();
    if (k.in_flight) {
      ++it;
      continue;
    }
    detached.erase(it->first);
    it = keys.erase(it);
  }
}

std::vector<int64_t> App::known_after(int64_t cursor) const {
  return std::vector<int64_t>(known.upper_bound(cursor), known.end());
}

}  // namespace outlive::publisher
