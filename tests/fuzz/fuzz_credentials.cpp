// auth::credential_from and auth::viewer_id (src/auth) on arbitrary request headers. The input is
// the Cookie header, the Authorization header and the cookie name (default "session"), one per
// line. The same lines are also a list of scopes, whose viewer id must give the list back.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "auth/auth.hpp"

using outlive::auth::credential_from;
using outlive::auth::CredentialKind;

namespace {

void require(bool condition) {
  if (!condition) std::abort();
}

std::vector<std::string> lines(std::string_view text) {
  std::vector<std::string> out;
  for (;;) {
    const size_t end = text.find('\n');
    out.emplace_back(text.substr(0, end));
    if (end == std::string_view::npos) return out;
    text.remove_prefix(end + 1);
  }
}

// The scopes of a viewer id's last part, read back: "," separates, "\" escapes the next byte.
std::vector<std::string> scopes_of(std::string_view part) {
  std::vector<std::string> out;
  if (part.empty()) return out;
  out.emplace_back();
  for (size_t i = 0; i < part.size(); ++i) {
    if (part[i] == '\\') {
      require(i + 1 < part.size());
      require(part[i + 1] == '\\' || part[i + 1] == ',');
      out.back() += part[++i];
    } else if (part[i] == ',') {
      out.emplace_back();
    } else {
      out.back() += part[i];
    }
  }
  return out;
}

void check_credentials(const std::vector<std::string>& parts) {
  const std::string& cookie = parts[0];
  const std::string authorization = parts.size() > 1 ? parts[1] : "";
  const std::string name = parts.size() > 2 ? parts[2] : "session";
  const auto c = credential_from(cookie, authorization, name);
  const auto cookie_only = credential_from(cookie, "", name);
  const auto bearer_only = credential_from("", authorization, name);
  if (!c) {
    require(!cookie_only && !bearer_only);
    return;
  }
  require(!c->token.empty());
  if (c->kind == CredentialKind::session_cookie) {
    require(!name.empty());
    require(cookie.find(name) != std::string::npos);
    require(cookie.find(c->token) != std::string::npos);
    require(c->token.find(';') == std::string::npos);
    require(cookie_only && cookie_only->token == c->token);
  } else {
    // The cookie wins when there is one, so a Bearer answer means there was none.
    require(!cookie_only);
    require(authorization.find(c->token) != std::string::npos);
    require(c->token.find_first_of(" \t") == std::string::npos);
    require(bearer_only && bearer_only->kind == CredentialKind::bearer &&
            bearer_only->token == c->token);
  }
}

void check_viewer_id(std::vector<std::string> scopes, bool app_session) {
  const std::string prefix = app_session ? "user:f:app:" : "user:f:";
  const std::string id = outlive::auth::viewer_id("user:f", app_session, scopes);
  require(id.compare(0, prefix.size(), prefix) == 0);
  std::sort(scopes.begin(), scopes.end());
  const auto back = scopes_of(std::string_view(id).substr(prefix.size()));
  // The one pair the rule cannot tell apart: no scope, and one empty scope.
  if (scopes == std::vector<std::string>{""}) {
    require(back.empty());
  } else {
    require(back == scopes);
  }
  require(outlive::auth::viewer_id("user:f", app_session, std::nullopt) ==
          prefix.substr(0, prefix.size() - 1));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto parts = lines(text);
  check_credentials(parts);
  check_viewer_id(parts, size % 2 == 1);
  return 0;
}
