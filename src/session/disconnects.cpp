#include "session/disconnects.hpp"

namespace outlive::session {

int64_t Disconnects::oldest_kept_ms() const {
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  return now - std::chrono::duration_cast<std::chrono::milliseconds>(kept_).count();
}

void Disconnects::record(const std::string& app, const std::string& viewer, int64_t at_ms) {
  const int64_t oldest = oldest_kept_ms();
  std::lock_guard lock(mutex_);
  // Pruned as they come: a disconnect per sign-out, so this walk is as long as the last hour's.
  for (auto it = latest_.begin(); it != latest_.end();) {
    it = it->second < oldest ? latest_.erase(it) : std::next(it);
  }
  if (at_ms < oldest) return;
  auto& at = latest_[{app, viewer}];
  at = std::max(at, at_ms);
}

bool Disconnects::refuses(const std::string& app, const std::string& viewer_id,
                          std::optional<int64_t> issued_at_s) const {
  const int64_t oldest = oldest_kept_ms();
  std::lock_guard lock(mutex_);
  if (latest_.empty()) return false;
  // The id itself, then each id above it (`user:ada:app` -> `user:ada` -> `user`).
  for (size_t end = viewer_id.size(); end > 0;) {
    const auto it = latest_.find({app, viewer_id.substr(0, end)});
    if (it != latest_.end() && it->second >= oldest &&
        (!issued_at_s || *issued_at_s <= it->second / 1000))
      return true;
    const auto colon = viewer_id.rfind(':', end - 1);
    if (colon == std::string::npos || colon == 0) break;
    end = colon;
  }
  return false;
}

}  // namespace outlive::session
