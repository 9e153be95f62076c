#include "admission/admission.hpp"

namespace outlive::admission {

Admission::Admission(std::string session_cookie, int opens_per_second, int max_sockets_per_viewer)
    : session_cookie_(std::move(session_cookie)),
      opens_(opens_per_second),
      sockets_(max_sockets_per_viewer) {}

std::variant<auth::Credential, Refusal> Admission::before_lookup(
    const OpenRequest& request, const std::set<std::string>& origins, Clock::time_point opened_at) {
  const auto credential =
      auth::credential_from(request.cookie, request.authorization, session_cookie_);
  const bool by_cookie = credential && credential->kind == auth::CredentialKind::session_cookie;
  if (!by_cookie && !opens_.allow("addr:" + request.address, opened_at)) {
    return Refusal{"rate_limited", "too many sockets opened from this address", 1013};
  }
  if (!credential) return Refusal{"unauthorized", "no credential", 1008};
  if (by_cookie && !request.origin.empty() && origins.count(request.origin) == 0) {
    return Refusal{"forbidden_origin",
                   "origin " + request.origin + " may not open sockets of \"" + request.app + "\"",
                   1008};
  }
  return *credential;
}

std::optional<Refusal> Admission::after_lookup(const auth::Viewer& viewer,
                                               const auth::Credential& credential,
                                               Clock::time_point opened_at) {
  // Counted at the time the socket opened, whenever its check finished.
  if (credential.kind == auth::CredentialKind::session_cookie &&
      !opens_.allow("person:" + viewer.access_subject, opened_at)) {
    return Refusal{"rate_limited", "too many sockets opened by this person", 1013};
  }
  if (!sockets_.try_add(viewer.id)) {
    return Refusal{"too_many_sockets", "this viewer has too many sockets on this replica", 1013};
  }
  return std::nullopt;
}

Admission::Gate Admission::begin_lookup(const std::string& address, Clock::time_point now) {
  std::lock_guard lock(lookups_mutex_);
  auto& l = lookups_[address];
  while (!l.failed.empty() && now - l.failed.front() >= std::chrono::seconds(1)) l.failed.pop_front();
  const int failed = static_cast<int>(l.failed.size());
  if (failed >= kFailedLookupsPerSecond) return Gate::refuse;
  // Lookups still running may all fail: at most 5 run at once per address, the rest wait for them.
  if (l.running + failed >= kFailedLookupsPerSecond) return Gate::wait;
  ++l.running;
  return Gate::go;
}

void Admission::lookup_ended(const std::string& address, bool found, Clock::time_point at) {
  std::lock_guard lock(lookups_mutex_);
  auto it = lookups_.find(address);
  if (it == lookups_.end()) return;
  auto& l = it->second;
  --l.running;
  if (!found) l.failed.push_back(at);
  while (!l.failed.empty() && at - l.failed.front() >= std::chrono::seconds(1)) l.failed.pop_front();
  if (l.running <= 0 && l.failed.empty()) lookups_.erase(it);
}

}  // namespace outlive::admission
