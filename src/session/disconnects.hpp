#pragma once
// The events.disconnect calls of the last auth.jwt.max_lifetime_s, per app (SPEC 2.6 rev 4): a JWT
// of a viewer one of them names, issued before it, is refused for as long as such a token can be
// valid. Filled at start from events.disconnects (a replica started later knows them too), then
// from each app's topic as they arrive. Thread-safe.
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace outlive::session {

class Disconnects {
 public:
  explicit Disconnects(std::chrono::seconds kept) : kept_(kept) {}

  // `viewer` of `app` was disconnected at `at_ms` (unix milliseconds, Postgres's clock).
  void record(const std::string& app, const std::string& viewer, int64_t at_ms);
  // True when a disconnect of `viewer_id`, or of an id it is under (`user:ada` for
  // `user:ada:app`), is not older than kept and the token was issued (`iat`, unix seconds) in or
  // before its second. A token without `iat` may be from before any of them: refused too.
  bool refuses(const std::string& app, const std::string& viewer_id,
               std::optional<int64_t> issued_at_s) const;

 private:
  int64_t oldest_kept_ms() const;

  const std::chrono::seconds kept_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, int64_t> latest_;  // (app, viewer) -> at_ms
};

}  // namespace outlive::session
