#include "admission/admission.hpp"

namespace outlive::admission {

std::string client_address(const std::string& peer, bool peer_is_loopback,
                           std::string_view forwarded_for) {
  if (!peer_is_loopback || forwarded_for.empty()) return peer;
  const auto comma = forwarded_for.rfind(',');
  std::string last(comma == std::string_view::npos ? forwarded_for
                                                   : forwarded_for.substr(comma + 1));
  last.erase(0, last.find_first_not_of(' '));
  last.erase(last.find_last_not_of(' ') + 1);
  return last.empty() ? peer : last;
}

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

}  // namespace outlive::admission
