#include "admission/admission.hpp"

#include <malloc.h>

#include <algorithm>

#include "admission/proxies.hpp"

namespace outlive::admission {

Admission::Admission(std::string session_cookie, int opens_per_second, int max_sockets_per_viewer,
                     int ipv6_prefix, std::optional<std::string> jwt_cookie, bool hook)
    : session_cookie_(std::move(session_cookie)),
      jwt_cookie_(std::move(jwt_cookie)),
      hook_(hook),
      ipv6_prefix_(ipv6_prefix),
      opens_(opens_per_second),
      sockets_(max_sockets_per_viewer) {}

std::variant<auth::Credential, Refusal> Admission::before_lookup(
    const OpenRequest& request, const std::set<std::string>& origins, Clock::time_point opened_at) {
  // With auth.hook the session cookie is the application's to read: only a JWT of auth.jwt is
  // taken here, whatever else the request carries goes to the hook.
  auto credential = auth::credential_from(request.cookie, request.authorization,
                                          hook_ ? std::string() : session_cookie_,
                                          jwt_cookie_.value_or(std::string()));
  if (credential && jwt_cookie_ && credential->kind == auth::CredentialKind::bearer &&
      auth::looks_like_jwt(credential->token)) {
    credential->kind = auth::CredentialKind::jwt;
  }
  if (hook_ && !(credential && auth::is_jwt(credential->kind))) {
    credential.reset();
    if (!request.hook_headers.empty()) {
      bool cookie = false;
      for (const auto& [name, value] : request.hook_headers) cookie = cookie || name == "cookie";
      credential = auth::Credential{
          cookie ? auth::CredentialKind::hook_cookie : auth::CredentialKind::hook,
          auth::hook_credential(request.hook_headers, request.origin, request.address)};
    }
  }
  const bool by_cookie = credential && auth::is_cookie(credential->kind);
  if (!by_cookie && !opens_.allow("addr:" + limit_key(request.address, ipv6_prefix_), opened_at)) {
    return Refusal{"rate_limited", "too many sockets opened from this address", 1013};
  }
  // With auth.jwt the tab may send its token as its first message (a browser cannot set headers
  // on a websocket, and a token in the URL ends up in logs).
  if (!credential && jwt_cookie_) return auth::Credential{auth::CredentialKind::pending, {}};
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
  if (auth::is_cookie(credential.kind) &&
      !opens_.allow("person:" + viewer.access_subject, opened_at)) {
    return Refusal{"rate_limited", "too many sockets opened by this person", 1013};
  }
  if (!sockets_.try_add(viewer.id)) {
    return Refusal{"too_many_sockets", "this viewer has too many sockets on this replica", 1013};
  }
  return std::nullopt;
}

namespace {
void forget_older(std::vector<Admission::Clock::time_point>& failed,
                  Admission::Clock::time_point now) {
  auto fresh = std::find_if(failed.begin(), failed.end(),
                            [&](auto t) { return now - t < std::chrono::seconds(1); });
  failed.erase(failed.begin(), fresh);
}
}  // namespace

Admission::Gate Admission::begin_lookup(const std::string& address, Clock::time_point now) {
  std::lock_guard lock(lookups_mutex_);
  sweep(now);
  auto& l = lookups_[limit_key(address, ipv6_prefix_)];
  forget_older(l.failed, now);
  const int failed = static_cast<int>(l.failed.size());
  if (failed >= kFailedLookupsPerSecond) return Gate::refuse;
  // Lookups still running may all fail: at most 5 run at once per address, the rest wait for them.
  if (l.running + failed >= kFailedLookupsPerSecond) return Gate::wait;
  ++l.running;
  return Gate::go;
}

void Admission::lookup_ended(const std::string& address, bool found, Clock::time_point at) {
  std::lock_guard lock(lookups_mutex_);
  auto it = lookups_.find(limit_key(address, ipv6_prefix_));
  if (it == lookups_.end()) return;
  auto& l = it->second;
  --l.running;
  if (!found) l.failed.push_back(at);
  forget_older(l.failed, at);
  if (l.running <= 0 && l.failed.empty()) lookups_.erase(it);
  sweep(at);
}

// An address whose last lookup failed keeps its entry for the second it counts in; nothing else
// would remove it once the address goes quiet (50,000 addresses kept ~0.8 KiB each for good).
void Admission::sweep(Clock::time_point now) {
  if (now - last_sweep_ < std::chrono::seconds(1)) return;
  last_sweep_ = now;
  for (auto it = lookups_.begin(); it != lookups_.end();) {
    forget_older(it->second.failed, now);
    if (it->second.running <= 0 && it->second.failed.empty()) {
      it = lookups_.erase(it);
    } else {
      ++it;
    }
  }
}

void Admission::forget_quiet(Clock::time_point now) {
  const size_t before = tracked();
  opens_.prune_quiet(now);
  {
    std::lock_guard lock(lookups_mutex_);
    sweep(now);
  }
  // A flood of addresses frees its state (and its sockets') in the io threads' malloc arenas,
  // which glibc does not give back: after 50,000 junk opens 44 MiB stayed free in them with
  // 1.9 MiB in use, RSS +41 MiB for good. Once such a flood's entries are gone, hand it back.
  if (before >= tracked() + kTrimAfterForgetting) ::malloc_trim(0);
}

size_t Admission::tracked() {
  std::lock_guard lock(lookups_mutex_);
  return lookups_.size() + opens_.keys();
}

}  // namespace outlive::admission
